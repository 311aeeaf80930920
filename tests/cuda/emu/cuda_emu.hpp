// A small CUDA execution emulator for tests: runs a kernel written for nvcc on the CPU, one
// fiber (ucontext) per CUDA thread, blocks one after another, so that CI (no GPU) checks a
// kernel's exact logic — indexing, barriers, warp collectives, mma / ldmatrix fragment layouts
// — against the CPU reference. Not a performance model; races are not detected (fibers switch
// only at barriers and warp collectives, so every read between two barriers sees the others'
// writes made before the first one: what a correct kernel needs, not what a racy one gets).
//
// Use: #define FP4MOE_CUDA_EMU before including this and the kernel's .cuh (which must include
// only cuda/common/device_prims.cuh for device built-ins), then emu::launch(grid, block,
// dynamic_smem_bytes, kernel, params...). Device pointers are host pointers.
//
// Supported: threadIdx / blockIdx / blockDim / gridDim, __syncthreads, named barriers
// (bar.sync / bar.arrive with a thread count: emu::named_barrier), __syncwarp, __shfl*_sync,
// __ballot_sync, __any_sync, __all_sync, __match_any_sync, atomics (plain: fibers are
// cooperative), __threadfence (no-op), static __shared__ (one block at a time) and dynamic
// shared memory (FP4MOE_DYNAMIC_SMEM), plus the warp-level primitives of device_prims.cuh,
// __nv_bfloat16 with its conversions (incl. __float2bfloat16_rn), make_uint2 / make_uint4,
// __align__, __expf (as std::exp), int min / max, and the IEEE
// __fdiv_rn / __fmul_rn / __fadd_rn / __fsub_rn. logf / expf are the host's (the CPU sampler's).
#pragma once

#if !defined(FP4MOE_CUDA_EMU)
#error "define FP4MOE_CUDA_EMU before including cuda_emu.hpp"
#endif

// Fibers switch with _setjmp / _longjmp (no signal-mask system call); glibc's fortified
// longjmp would refuse to jump between stacks, so fortification is off in this translation unit
// (this header must come first).
#if defined(_FORTIFY_SOURCE)
#undef _FORTIFY_SOURCE
#endif
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };

namespace emu {

struct Fiber {
  ucontext_t ctx{};  // first entry only
  jmp_buf jb;
  bool started = false;
  dim3 tid;
  int linear = 0;
  bool done = false;
  int wait_kind = 0;  // 0 none, 1 block barrier, 2 warp barrier, 3 named barrier wait_id
  int wait_id = 0;
  uint64_t wait_gen = 0;
};

struct WarpState {
  int arrived = 0;
  uint64_t gen = 0;
  uint64_t slot[32][16] = {};
};

// A named barrier (bar.sync / bar.arrive id, count): completes when `count` threads have
// arrived; every arrival of one generation must give the same count.
struct NamedBarrier {
  int arrived = 0, count = 0;
  uint64_t gen = 0;
};

struct BlockState {
  std::vector<Fiber> fibers;
  int live = 0, arrived = 0;
  uint64_t gen = 0;
  std::vector<WarpState> warps;
  NamedBarrier named[16];
};

inline dim3 g_block_idx, g_block_dim, g_grid_dim;
inline Fiber* g_cur = nullptr;
inline BlockState* g_block = nullptr;
inline jmp_buf g_sched;
inline std::vector<unsigned char> g_dyn_smem;
inline std::function<void()> g_body;

inline Fiber& self() { return *g_cur; }
inline int lane() { return g_cur->linear & 31; }
inline WarpState& warp() { return g_block->warps[size_t(g_cur->linear >> 5)]; }
inline unsigned char* dynamic_smem() { return g_dyn_smem.data(); }

inline void yield() {
  if (!_setjmp(g_cur->jb)) _longjmp(g_sched, 1);
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block %u,%u thread %d)\n", what, g_block_idx.x, g_block_idx.y,
               g_cur ? g_cur->linear : -1);
  std::abort();
}

inline void release_block_if_complete() {
  BlockState& b = *g_block;
  if (b.arrived > 0 && b.arrived == b.live) {
    b.arrived = 0;
    ++b.gen;
  }
}

inline void block_sync() {
  BlockState& b = *g_block;
  const uint64_t gen = b.gen;
  ++b.arrived;
  release_block_if_complete();
  if (b.gen != gen) return;
  g_cur->wait_kind = 1;
  g_cur->wait_gen = gen;
  yield();
}

// bar.sync (wait) / bar.arrive (!wait) on named barrier id 1..15 with `count` threads (a
// multiple of 32); fails on a count that differs within a generation (the hardware's undefined
// behaviour) and on a generation still open when the block ends (an arrival nobody waited for),
// so a producer / consumer protocol that arrives once too often shows.
inline void named_barrier(int id, int count, bool wait) {
  if (id < 1 || id > 15 || count <= 0 || count % 32 != 0) fail("named barrier: id 1..15, count a multiple of 32");
  NamedBarrier& nb = g_block->named[id];
  if (nb.arrived == 0) nb.count = count;
  else if (nb.count != count) fail("named barrier: arrivals of one generation give different counts");
  const uint64_t gen = nb.gen;
  if (++nb.arrived == count) {
    nb.arrived = 0;
    ++nb.gen;
    return;
  }
  if (!wait) return;
  g_cur->wait_kind = 3;
  g_cur->wait_id = id;
  g_cur->wait_gen = gen;
  yield();
}

// All lanes of `mask` must call (the kernels here use full or uniform masks).
inline void warp_sync(unsigned mask) {
  WarpState& w = warp();
  const int expect = __builtin_popcount(mask);
  const uint64_t gen = w.gen;
  if (++w.arrived == expect) {
    w.arrived = 0;
    ++w.gen;
    return;
  }
  g_cur->wait_kind = 2;
  g_cur->wait_gen = gen;
  yield();
}

inline bool runnable(const Fiber& f) {
  if (f.done) return false;
  if (f.wait_kind == 1) return g_block->gen != f.wait_gen;
  if (f.wait_kind == 2) return g_block->warps[size_t(f.linear >> 5)].gen != f.wait_gen;
  if (f.wait_kind == 3) return g_block->named[f.wait_id].gen != f.wait_gen;
  return true;
}

inline void trampoline() {
  g_body();
  g_cur->done = true;
  --g_block->live;
  release_block_if_complete();
  _longjmp(g_sched, 1);
}

// Runs f until it waits at a barrier or ends.
inline void run_fiber(Fiber& f) {
  f.wait_kind = 0;
  g_cur = &f;
  if (!_setjmp(g_sched)) {
    if (!f.started) {
      f.started = true;
      setcontext(&f.ctx);
    }
    _longjmp(f.jb, 1);
  }
}

inline std::vector<std::unique_ptr<char[]>> g_stacks;  // reused by every block

// Runs kernel(args...) over the grid; dynamic shared memory of `smem_bytes` (zeroed per
// block with 0xA5 poison, so a kernel that reads before writing shows it).
template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t smem_bytes, Kernel kernel, Args... args) {
  const int nthreads = int(block.x * block.y * block.z);
  constexpr size_t kStack = size_t(128) << 10;
  while (g_stacks.size() < size_t(nthreads)) g_stacks.emplace_back(new char[kStack]);
  g_grid_dim = grid;
  g_block_dim = block;
  g_dyn_smem.assign(std::max<size_t>(smem_bytes, 16), 0xA5);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        g_block_idx = dim3(bx, by, bz);
        std::fill(g_dyn_smem.begin(), g_dyn_smem.end(), 0xA5);
        BlockState b;
        b.fibers.resize(size_t(nthreads));
        b.live = nthreads;
        b.warps.resize(size_t((nthreads + 31) / 32));
        g_block = &b;
        g_body = [&] { kernel(args...); };
        for (int t = 0; t < nthreads; ++t) {
          Fiber& f = b.fibers[size_t(t)];
          f.linear = t;
          f.tid = dim3(unsigned(t) % block.x, (unsigned(t) / block.x) % block.y, unsigned(t) / (block.x * block.y));
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = g_stacks[size_t(t)].get();
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = nullptr;
          makecontext(&f.ctx, trampoline, 0);
        }
        for (;;) {
          bool progress = false, all_done = true;
          for (Fiber& f : b.fibers) {
            if (f.done) continue;
            all_done = false;
            if (!runnable(f)) continue;
            run_fiber(f);
            progress = true;
          }
          if (all_done) break;
          if (!progress) fail("deadlock: every live thread waits at a barrier that cannot complete");
        }
        for (const NamedBarrier& nb : b.named)  // an arrival no one waited for: a protocol slip
          if (nb.arrived != 0) fail("a named barrier ends the block with arrivals of an unfinished generation");
        g_cur = nullptr;
        g_block = nullptr;
      }
}

template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T>
inline T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

// One warp collective: every lane of `mask` publishes `n` 64-bit words, then reads what it needs.
inline void publish(unsigned mask, const uint64_t* words, int n) {
  WarpState& w = warp();
  for (int i = 0; i < n; ++i) w.slot[lane()][i] = words[i];
  warp_sync(mask);
}
inline uint64_t peer(int src_lane, int word) { return warp().slot[src_lane & 31][word]; }

}  // namespace emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define threadIdx (::emu::self().tid)
#define blockIdx (::emu::g_block_idx)
#define blockDim (::emu::g_block_dim)
#define gridDim (::emu::g_grid_dim)

inline void __syncthreads() { emu::block_sync(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_sync(mask); }
inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE division, as on the device
// One IEEE rounding each (the test translation units are built without FMA contraction: no
// -march with FMA, and the sampler's own CPU source is built with -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const uint64_t x = emu::to_bits(v);
  emu::publish(mask, &x, 1);
  const int base = emu::lane() & ~(width - 1);
  const T r = emu::from_bits<T>(emu::peer(base + (src & (width - 1)), 0));
  emu::warp_sync(mask);
  return r;
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  return __shfl_sync(mask, v, emu::lane() ^ m, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  const uint64_t x = emu::to_bits(v);
  emu::publish(mask, &x, 1);
  const int l = emu::lane(), in = l & (width - 1);
  const T r = in >= int(d) ? emu::from_bits<T>(emu::peer(l - int(d), 0)) : v;
  emu::warp_sync(mask);
  return r;
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  const uint64_t x = emu::to_bits(v);
  emu::publish(mask, &x, 1);
  const int l = emu::lane(), in = l & (width - 1);
  const T r = in + int(d) < width ? emu::from_bits<T>(emu::peer(l + int(d), 0)) : v;
  emu::warp_sync(mask);
  return r;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const uint64_t x = pred ? 1 : 0;
  emu::publish(mask, &x, 1);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l) & 1u) r |= unsigned(emu::peer(l, 0) & 1) << l;
  emu::warp_sync(mask);
  return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
template <typename T>
inline unsigned __match_any_sync(unsigned mask, T v) {
  const uint64_t x = emu::to_bits(v);
  emu::publish(mask, &x, 1);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && emu::peer(l, 0) == x) r |= 1u << l;
  emu::warp_sync(mask);
  return r;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned __float_as_uint(float f) { return emu::from_bits<unsigned>(emu::to_bits(f)); }
inline float __uint_as_float(unsigned u) { return emu::from_bits<float>(u); }
inline int __float_as_int(float f) { return emu::from_bits<int>(emu::to_bits(f)); }
inline float __int_as_float(int u) { return emu::from_bits<float>(emu::to_bits(u)); }
inline float exp2f_approx(float x) { return std::exp2(x); }
inline float __expf(float x) { return std::exp(x); }  // the device's ex2.approx-based one is ~2 ulp off
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
using std::isnan;
using std::isfinite;

// BF16 as the row kernels use it (cuda_bf16.h's type, conversions round to nearest even).
struct __nv_bfloat16 {
  unsigned short x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return emu::from_bits<float>(uint64_t(h.x) << 16); }
inline __nv_bfloat16 __float2bfloat16(float f) {
  const uint32_t u = emu::from_bits<uint32_t>(emu::to_bits(f));
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // NaN stays (quiet) NaN
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

template <typename T>
inline T __ldcg(const T* p) { return *p; }
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline void __stcg(T* p, T v) { *p = v; }

template <typename T>
inline T atomicAdd(T* p, T v) { const T o = *p; *p = o + v; return o; }
template <typename T>
inline T atomicOr(T* p, T v) { const T o = *p; *p = o | v; return o; }
template <typename T>
inline T atomicMax(T* p, T v) { const T o = *p; *p = std::max(o, v); return o; }
template <typename T>
inline T atomicMin(T* p, T v) { const T o = *p; *p = std::min(o, v); return o; }
template <typename T>
inline T atomicExch(T* p, T v) { const T o = *p; *p = v; return o; }
