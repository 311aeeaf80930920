// Small PTX wrappers for the sm_90a kernels: mbarriers, bulk / tensor copies (TMA),
// wgmma fences, setmaxnreg, bf16x2 multiply. Our own, on purpose: a few dozen lines that
// compile fast and read plainly, instead of CuTe's atom machinery (see README.md).
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (type only; the driver entry point is fetched at run time)

namespace fp4moe::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ---------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait(smem_u32(bar), parity); }

// ---- copies -----------------------------------------------------------------------------
// 1-D bulk copy global -> shared completing on `bar` (bytes and addresses 16-byte aligned).
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                              uint64_t cache_policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(cache_policy)
      : "memory");
}
// 2-D tiled tensor copy (coordinates innermost first) completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// ---- warpgroup ----------------------------------------------------------------------------
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Named barrier over `threads` threads (multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory matrix descriptor for a K-major, 128-byte-swizzled tile whose rows are 128 B
// (64 BF16) and whose 8-row groups are 1024 B apart; the tile must be 1024-byte aligned.
__device__ __forceinline__ uint64_t make_desc_k_sw128(uint32_t smem_addr) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);  // start address
  d |= uint64_t(1) << 16;                     // leading byte offset (unused with swizzle)
  d |= uint64_t(1024 >> 4) << 32;             // stride byte offset: 8 rows x 128 B
  d |= uint64_t(1) << 62;                     // layout: 128-byte swizzle
  return d;
}

// Shared-memory loads by 32-bit shared address (plain pointers into the realigned dynamic
// buffer would otherwise compile to generic loads).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// Four 8x8 b16 matrices from shared memory (lane i gives the address of row i % 8 of matrix
// i / 8); register q holds (row lane / 4, columns 2 (lane % 4), +1) of matrix q.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- warp-level MMA (sm_80+) --------------------------------------------------------------
// d (16 x 8, f32) += a (16 x 16 bf16, row) * b (16 x 8 bf16, col): the m16n8k16 fragments.
__device__ __forceinline__ void mma_m16n8k16_bf16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Makes `v` opaque to the compiler, so that a loop invariant stays in its register instead of
// being recomputed inside the loop (rematerialization).
__device__ __forceinline__ void pin_register(uint32_t& v) { asm volatile("" : "+r"(v)); }

// ---- arithmetic -------------------------------------------------------------------------
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// a * {lo(s), lo(s)} and a * {hi(s), hi(s)} (bf16x2): written so that ptxas folds the
// broadcast into HMUL2's .H0_H0 / .H1_H1 operand selector (no PRMT).
__device__ __forceinline__ uint32_t mul_bf16x2_lo(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {l, l};\n mul.rn.bf16x2 %0, %1, t;\n}"
      : "=r"(d)
      : "r"(a), "r"(s));
  return d;
}
__device__ __forceinline__ uint32_t mul_bf16x2_hi(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {h, h};\n mul.rn.bf16x2 %0, %1, t;\n}"
      : "=r"(d)
      : "r"(a), "r"(s));
  return d;
}
// The E4M3 byte pair in the low (kHigh = false) or high half of `w` -> f16x2, exact; one
// F2FP (its .H1 operand selector picks the high half: no extraction instruction).
template <bool kHigh>
__device__ __forceinline__ uint32_t e4m3x2_half_to_f16x2(uint32_t w) {
  uint32_t d;
  if constexpr (kHigh)
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(w));
  else
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(w));
  return d;
}
// Two E4M3 bytes (low byte -> low half) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair16) {
  uint32_t d;
  asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}" : "=r"(d) : "r"(pair16));
  return d;
}

}  // namespace fp4moe::cuda::sm90
