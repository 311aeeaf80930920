// Device primitives shared by the hand-written kernels (top-k, MLA decode): dynamic shared
// memory, lane masks, block-wide scans, cp.async, ldmatrix, mma.sync and FP8 / 16-bit
// conversions. Each has a plain-C++ twin for tests/cuda/emu (FP4MOE_CUDA_EMU), so the kernels
// that use only these (and the CUDA built-ins the emulator provides) run on the CPU in CI.
#pragma once

#include <cstdint>

#if defined(FP4MOE_CUDA_EMU)
#include "cuda/emu/cuda_emu.hpp"
#include "format/codecs.hpp"
#else
#include <cuda_fp8.h>
#endif

namespace fp4moe::cuda::prims {

#if defined(FP4MOE_CUDA_EMU)
#define FP4MOE_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::emu::dynamic_smem())
#else
#define FP4MOE_DYNAMIC_SMEM(T, name)                                   \
  extern __shared__ __align__(16) unsigned char fp4moe_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(fp4moe_dynamic_smem_)
#endif

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ int lane_id() { return int(threadIdx.x & 31); }
__device__ __forceinline__ int warp_id() { return int(threadIdx.x >> 5); }
// Bits of the lanes below this one.
__device__ __forceinline__ unsigned lanemask_lt() { return (1u << lane_id()) - 1u; }

// Sum over the warp's 32 lanes (xor butterfly: every lane gets the same value).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Warp-aggregated append: each lane with `in` gets its own index from *counter (one atomic per
// warp, lanes in lane order), the others -1. Every lane of the warp calls.
__device__ __forceinline__ int warp_append(bool in, int* counter) {
  const unsigned b = __ballot_sync(kFullMask, in);
  if (b == 0u) return -1;
  int at = 0;
  if (lane_id() == 0) at = atomicAdd(counter, __popc(b));
  at = __shfl_sync(kFullMask, at, 0) + __popc(b & lanemask_lt());
  return in ? at : -1;
}

// Exclusive prefix sum of v over the block's threads in thread order (every thread calls);
// `total` gets the block's sum. scratch: >= 33 ints of shared memory, free again on return.
template <int kThreads>
__device__ __forceinline__ int block_exclusive_sum(int v, int& total, int* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "");
  constexpr int kWarps = kThreads / 32;
  const int lane = lane_id(), warp = warp_id();
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int x = lane < kWarps ? scratch[lane] : 0;
    int xi = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(kFullMask, xi, o);
      if (lane >= o) xi += n;
    }
    if (lane < kWarps) scratch[lane] = xi - x;
    if (lane == 31) scratch[32] = xi;
  }
  __syncthreads();
  const int r = scratch[warp] + incl - v;
  total = scratch[32];
  __syncthreads();
  return r;
}

// ---- 16-bit floats -------------------------------------------------------------------------
#if defined(FP4MOE_CUDA_EMU)
inline uint16_t emu_float_to_bf16(float f) {  // RNE, NaN kept quiet
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float emu_bf16_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
inline uint16_t emu_float_to_f16(float f) {  // RNE with subnormals, overflow -> inf
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                   // below 2^-14: subnormal (or 0)
    const float v = __uint_as_float(a) * 16777216.0f;      // * 2^24: the subnormal's integer
    const float r = std::nearbyint(v);                     // current rounding mode: nearest-even
    return uint16_t(sign | uint32_t(r));
  }
  const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}
inline float emu_f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.f : 1.f) * float(m) * 5.9604644775390625e-8f;  // m * 2^-24
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
inline float emu_e4m3_to_float(uint32_t b) {
  const float sign = (b & 0x80u) ? -1.f : 1.f;
  const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * float(m) * 0.001953125f;  // m * 2^-9
  return sign * std::ldexp(1.f + float(m) / 8.f, int(e) - 7);
}
#endif

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(FP4MOE_CUDA_EMU)
  return uint32_t(emu_float_to_bf16(lo)) | (uint32_t(emu_float_to_bf16(hi)) << 16);
#else
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
#if defined(FP4MOE_CUDA_EMU)
  return uint32_t(emu_float_to_f16(lo)) | (uint32_t(emu_float_to_f16(hi)) << 16);
#else
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}
__device__ __forceinline__ float bf16_bits_to_float(uint32_t h16) { return __uint_as_float(h16 << 16); }
// float -> E4M3 code, round to nearest even, saturating to +-448 (NaN -> 0x7F): the
// `__nv_fp8_e4m3(float)` conversion on the device, format/codecs.hpp's e4m3_from_float here.
__device__ __forceinline__ uint32_t float_to_e4m3_bits(float x) {
#if defined(FP4MOE_CUDA_EMU)
  return ::fp4moe::e4m3_from_float(x);
#else
  return uint32_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#endif
}
// Two E4M3 codes (bits 0-7 -> low half, 8-15 -> high half) to two exact FP16 values (sm_89+).
__device__ __forceinline__ uint32_t cvt_e4m3x2_f16x2(uint32_t codes) {
#if defined(FP4MOE_CUDA_EMU)
  return uint32_t(emu_float_to_f16(emu_e4m3_to_float(codes & 0xffu))) |
         (uint32_t(emu_float_to_f16(emu_e4m3_to_float((codes >> 8) & 0xffu))) << 16);
#else
  uint32_t r;
  const unsigned short x = static_cast<unsigned short>(codes & 0xffffu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
#endif
}
// 2^x (approximate, flush-to-zero: 2^-inf = 0) and log2.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(FP4MOE_CUDA_EMU)
  return std::exp2(x);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#endif
}

// ---- cp.async (16 B; zero-filled and nothing read when !valid) -------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(FP4MOE_CUDA_EMU)
  if (valid) std::memcpy(smem, gmem, 16);
  else std::memset(smem, 0, 16);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(FP4MOE_CUDA_EMU)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(FP4MOE_CUDA_EMU)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ---- named barriers (bar.sync / bar.arrive, id 1..15; 0 is __syncthreads) --------------------
// count threads (a multiple of 32) complete a generation; bar_arrive does not wait. The
// producer / consumer handshakes of warp-specialized kernels.
__device__ __forceinline__ void bar_sync(int id, int count) {
#if defined(FP4MOE_CUDA_EMU)
  ::emu::named_barrier(id, count, true);
#else
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
#if defined(FP4MOE_CUDA_EMU)
  ::emu::named_barrier(id, count, false);
#else
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

// ---- programmatic dependent launch (PDL, sm_90+; cuda/common/launch.cuh launches with it) ----
// A kernel launched with PDL may have its blocks start while the kernel before it in the stream
// still runs. pdl_wait() returns once that kernel has completed and its writes are visible: a
// PDL-launched kernel calls it before its first global load or store. pdl_release() lets the
// next PDL-launched kernel start launching its blocks once every block of this one has called
// it (they then park in their own pdl_wait); called after pdl_wait, it cannot let a kernel two
// launches on start before this one's predecessor has finished. Both do nothing in a kernel
// launched without PDL, and in the emulator (its kernels run one after another).
__device__ __forceinline__ void pdl_wait() {
#if !defined(FP4MOE_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if !defined(FP4MOE_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- ldmatrix: four 8 x 8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses
// of matrix i (16 B each, shared memory). Register i of lane l: row l / 4, elements 2 (l % 4)
// and +1 of matrix i; with _trans: rows 2 (l % 4) and +1 of column l / 4.
#if defined(FP4MOE_CUDA_EMU)
inline void emu_ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  const uint64_t a = reinterpret_cast<uint64_t>(row);
  emu::publish(kFullMask, &a, 1);
  const int l = emu::lane(), g = l >> 2, c = l & 3;
  for (int i = 0; i < 4; ++i) {
    if (!trans) {
      const auto* p = reinterpret_cast<const unsigned char*>(emu::peer(8 * i + g, 0));
      std::memcpy(&r[i], p + 4 * c, 4);
    } else {
      uint16_t lo, hi;
      std::memcpy(&lo, reinterpret_cast<const unsigned char*>(emu::peer(8 * i + 2 * c, 0)) + 2 * g, 2);
      std::memcpy(&hi, reinterpret_cast<const unsigned char*>(emu::peer(8 * i + 2 * c + 1, 0)) + 2 * g, 2);
      r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
  emu::warp_sync(kFullMask);
}
#endif
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(FP4MOE_CUDA_EMU)
  emu_ldmatrix_x4(r, row, false);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(FP4MOE_CUDA_EMU)
  emu_ldmatrix_x4(r, row, true);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

// ---- mma.sync m16n8k16, FP32 accumulate: d += A (16 x 16, row) * B (16 x 8, col).
// g = lane / 4, c = lane % 4. A: a0 (row g, k 2c, 2c+1), a1 (row g+8), a2 (row g, k 2c+8, +9),
// a3 (row g+8, k 2c+8, +9). B: b0 (k 2c, 2c+1, col g), b1 (k 2c+8, +9). D: d0 (row g, col 2c),
// d1 (g, 2c+1), d2 (g+8, 2c), d3 (g+8, 2c+1). Low half = the lower k.
#if defined(FP4MOE_CUDA_EMU)
// Both mma shapes' fragments (m16n8, k = 8 e): e elements per 32-bit register, the lowest bits
// the lowest k (e 2: k16 BF16 / F16, e 4: k32 E4M3), decode(bits) an element's value.
template <typename Decode>
inline void emu_mma_m16n8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int e, Decode decode) {
  const uint64_t w[6] = {a[0], a[1], a[2], a[3], b0, b1};
  emu::publish(kFullMask, w, 6);
  const int bits = 32 / e, half = 4 * e;  // k per register of a lane quad
  auto elem = [&](uint64_t reg, int k) { return decode(uint32_t(reg >> (bits * (k % e))) & ((1u << bits) - 1u)); };
  auto A = [&](int row, int k) {
    const int src = (row & 7) * 4 + (k % half) / e, reg = (row >= 8 ? 1 : 0) + (k >= half ? 2 : 0);
    return elem(emu::peer(src, reg), k);
  };
  auto B = [&](int k, int col) {
    const int src = col * 4 + (k % half) / e, reg = 4 + (k >= half ? 1 : 0);
    return elem(emu::peer(src, reg), k);
  };
  const int l = emu::lane(), g = l >> 2, c = l & 3;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * c + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 2 * half; ++k) acc += A(row, k) * B(k, col);
    d[i] = acc;
  }
  emu::warp_sync(kFullMask);
}
inline void emu_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16) {
  emu_mma_m16n8(d, a, b0, b1, 2, [&](uint32_t bits) {
    return bf16 ? emu_bf16_to_float(uint16_t(bits)) : emu_f16_to_float(uint16_t(bits));
  });
}
#endif
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(FP4MOE_CUDA_EMU)
  emu_mma_16816(d, a, b0, b1, true);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(FP4MOE_CUDA_EMU)
  emu_mma_16816(d, a, b0, b1, false);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// ---- mma.sync m16n8k32 E4M3 x E4M3, FP32 accumulate (sm_89+): d += A (16 x 32) * B (32 x 8).
// Four codes per register, the lowest byte the lowest k. A: a0 (row g, k 4c .. 4c+3), a1 (row
// g+8), a2 (row g, k 4c+16 ..), a3 (row g+8, k 4c+16 ..). B: b0 (k 4c .. 4c+3, col g), b1 (k
// 4c+16 ..). D as m16n8k16. (The emulator sums exact products in FP32; Hopper's FP8 tensor cores
// keep fewer bits in the sum.)
#if defined(FP4MOE_CUDA_EMU)
inline void emu_mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu_mma_m16n8(d, a, b0, b1, 4, [](uint32_t bits) { return emu_e4m3_to_float(bits); });
}
#endif
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(FP4MOE_CUDA_EMU)
  emu_mma_e4m3_16832(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace fp4moe::cuda::prims
