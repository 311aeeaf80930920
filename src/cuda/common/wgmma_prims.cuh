// Warpgroup MMA (wgmma, sm_90a) for the hand-written kernels, with plain-C++ twins for the CUDA
// emulator (tests/cuda/emu): shared-memory matrix descriptors of the no-swizzle ("interleave")
// canonical layout, and the shapes the MLA decode kernels issue (BF16 or FP16 inputs: m64n32k16 with A
// from shared memory or registers, m64n256k16 with A from registers). Written from the PTX
// ISA's definitions (asynchronous warpgroup-level matrix operations):
//   - A core matrix is 8 rows of 16 bytes, 128 contiguous bytes. K-major operand: a row is 8
//     consecutive K elements of one M / N index; MN-major: a row is 8 consecutive M / N elements
//     of one K index. Either way LBO is the byte step between the two core matrices along K of a
//     k16 step, SBO the step between core matrices along M / N.
//   - The accumulator (m64nN, FP32): warp w of the warpgroup holds rows 16 w + g and 16 w + g + 8
//     (g = lane / 4, c = lane % 4); d[4 j + e] is n8 tile j: (row g, col 8 j + 2 c + (e & 1)),
//     rows + 8 for e >= 2 -- per warp, mma.sync m16n8's C layout tile after tile.
//   - A from registers (16-bit): per warp the m16k16 A fragment of mma.sync: a0 (g, 2c..2c+1),
//     a1 (g + 8, 2c..), a2 (g, 2c + 8..), a3 (g + 8, 2c + 8..).
// The asm needs sm_90a; compiled for another arch a kernel that reaches it traps (callers refuse
// to launch there). In the emulator each warp computes its 16 rows (the operation is the four
// warps' m16 slices with one B), one warp collective each.
#pragma once

#include <cstdint>

#include "cuda/common/device_prims.cuh"

namespace fp4moe::cuda::prims {

#if defined(FP4MOE_CUDA_EMU) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define FP4MOE_HAVE_WGMMA 1
#endif

// The shared-memory address a descriptor encodes: the offset in the shared window (the emulator:
// in the block's dynamic shared memory, which is all its kernels using wgmma use).
__device__ __forceinline__ uint32_t smem_offset(const void* p) {
#if defined(FP4MOE_CUDA_EMU)
  return uint32_t(static_cast<const unsigned char*>(p) - ::emu::dynamic_smem());
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// No-swizzle descriptor: start, LBO and SBO in bytes (multiples of 16, below 256 KB).
__device__ __forceinline__ uint64_t smem_desc(const void* start, uint32_t lbo, uint32_t sbo) {
  return uint64_t((smem_offset(start) >> 4) & 0x3FFFu) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32);
}

#if defined(FP4MOE_CUDA_EMU)
// One BF16 element of a no-swizzle operand: (mn, k) of a K-major or MN-major matrix.
inline float emu_desc_elem(uint64_t desc, int mn, int k, bool mn_major, bool f16 = false) {
  const uint32_t start = uint32_t(desc & 0x3FFFu) << 4, lbo = uint32_t((desc >> 16) & 0x3FFFu) << 4,
                 sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
  const uint32_t at = mn_major ? start + uint32_t(mn / 8) * sbo + uint32_t(k / 8) * lbo + uint32_t(k % 8) * 16 + uint32_t(mn % 8) * 2
                               : start + uint32_t(mn / 8) * sbo + uint32_t(k / 8) * lbo + uint32_t(mn % 8) * 16 + uint32_t(k % 8) * 2;
  uint16_t bits;
  std::memcpy(&bits, ::emu::dynamic_smem() + at, 2);
  return f16 ? emu_f16_to_float(bits) : emu_bf16_to_float(bits);
}
// d (this thread's accumulator of an m64nN tile) += A . B, k16. a_at(row, k) gives A.
template <int N, typename AAt>
inline void emu_wgmma(float* d, AAt a_at, uint64_t desc_b, bool b_mn_major, bool accumulate, bool f16) {
  const int l = ::emu::lane(), g = l >> 2, c = l & 3, w = (int(threadIdx.x) >> 5) & 3;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + (e >= 2 ? 8 : 0), col = 8 * j + 2 * c + (e & 1);
      float acc = accumulate ? d[4 * j + e] : 0.f;
      for (int k = 0; k < 16; ++k) acc += a_at(row, k) * emu_desc_elem(desc_b, col, k, b_mn_major, f16);
      d[4 * j + e] = acc;
    }
  ::emu::warp_sync(kFullMask);
}
#endif

// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
// async proxy that wgmma reads its operands through; then a barrier for the other threads' writes.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if !defined(FP4MOE_CUDA_EMU) && defined(FP4MOE_HAVE_WGMMA)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#if !defined(FP4MOE_CUDA_EMU) && defined(FP4MOE_HAVE_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if !defined(FP4MOE_CUDA_EMU) && defined(FP4MOE_HAVE_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if !defined(FP4MOE_CUDA_EMU) && defined(FP4MOE_HAVE_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// setmaxnreg (sm_90a): a warpgroup of a warp-specialized kernel gives back (dec) or takes (inc)
// registers per thread; every warp of the warpgroup executes it. A no-op in the emulator.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if !defined(FP4MOE_CUDA_EMU) && defined(FP4MOE_HAVE_WGMMA)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if !defined(FP4MOE_CUDA_EMU) && defined(FP4MOE_HAVE_WGMMA)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// D[64 x 32] (+)= A[64 x 16] . B[16 x 32]: A and B K-major in shared memory; BF16 inputs, or FP16
// (kF16).
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(FP4MOE_CUDA_EMU)
  emu_wgmma<32>(d, [&](int row, int k) { return emu_desc_elem(desc_a, row, k, false, kF16); }, desc_b, false, accumulate,
                kF16);
#elif defined(FP4MOE_HAVE_WGMMA)
#define FP4MOE_WGMMA_SS32(T) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
  if constexpr (kF16) FP4MOE_WGMMA_SS32("f16");
  else FP4MOE_WGMMA_SS32("bf16");
#undef FP4MOE_WGMMA_SS32
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

// D[64 x 32] (+)= A[64 x 16] . B[16 x 32]: A from registers (the fragment above), B K-major in
// shared memory; BF16 inputs, or FP16 (kF16).
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#if defined(FP4MOE_CUDA_EMU)
  const uint64_t w4[4] = {a[0], a[1], a[2], a[3]};
  ::emu::publish(kFullMask, w4, 4);
  auto a_at = [&](int row, int k) {  // row within the warp's 16: its quad's lanes hold it
    const int r = row & 15, src = (r & 7) * 4 + (k & 7) / 2, reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    const uint16_t bits = uint16_t(::emu::peer(src, reg) >> (16 * (k & 1)));
    return kF16 ? emu_f16_to_float(bits) : emu_bf16_to_float(bits);
  };
  emu_wgmma<32>(d, a_at, desc_b, false, accumulate, kF16);
#elif defined(FP4MOE_HAVE_WGMMA)
#define FP4MOE_WGMMA_RS32(T) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))
  if constexpr (kF16) FP4MOE_WGMMA_RS32("f16");
  else FP4MOE_WGMMA_RS32("bf16");
#undef FP4MOE_WGMMA_RS32
#else
  (void)d, (void)a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

// D[64 x 256] (+)= A[64 x 16] . B[16 x 256]: A from registers (the fragment above), B MN-major
// (N contiguous: transposed) in shared memory; BF16 inputs, or FP16 (kF16).
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n256k16_rs_bmn(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b,
                                                       bool accumulate) {
#if defined(FP4MOE_CUDA_EMU)
  const uint64_t w4[4] = {a[0], a[1], a[2], a[3]};
  ::emu::publish(kFullMask, w4, 4);
  auto a_at = [&](int row, int k) {  // row within the warp's 16: its quad's lanes hold it
    const int r = row & 15, src = (r & 7) * 4 + (k & 7) / 2, reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    const uint16_t bits = uint16_t(::emu::peer(src, reg) >> (16 * (k & 1)));
    return kF16 ? emu_f16_to_float(bits) : emu_bf16_to_float(bits);
  };
  emu_wgmma<256>(d, a_at, desc_b, true, accumulate, kF16);
#elif defined(FP4MOE_HAVE_WGMMA)
#define FP4MOE_WGMMA_RS256(T) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))
  if constexpr (kF16) FP4MOE_WGMMA_RS256("f16");
  else FP4MOE_WGMMA_RS256("bf16");
#undef FP4MOE_WGMMA_RS256
#else
  (void)d, (void)a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

}  // namespace fp4moe::cuda::prims
