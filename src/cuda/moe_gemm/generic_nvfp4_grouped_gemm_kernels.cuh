// GemmKernel::Generic kernel — see generic_nvfp4_grouped_gemm.hpp (host side in the .cpp, launch in
// the .cu). Device built-ins through cuda/common/device_prims.cuh only, so the kernel also runs on
// the CPU through tests/cuda/emu (tests/ops/linear_fp4_generic_emu_test).
//
// One CTA = (expert e, a tile of 128 weight rows); it loops over its expert's tokens in
// tiles of 64 and over K in steps of 64. Per K step the FP4 weight tile is decoded to
// BF16 into shared memory (exact), the token tile is copied as is, and 4 warps run
// mma.sync m16n8k16 (weights = the MMA M side, tokens = the N side, both K-contiguous,
// so every fragment register is one 32-bit shared load). The next K step's global loads
// are issued into registers before the MMAs of the current one (one-deep prefetch).
// Epilogue: FP32 tile staged in shared memory, global scale / SiLU·up / row scale in
// FP32, coalesced BF16 stores. With SiluMul a CTA owns 64 gate rows j and the 64
// matching up rows I + j, so it writes y[:, j] directly.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/moe_gemm/linear_fp4_decode.cuh"
#include "cuda/moe_gemm/linear_fp4_kernels.hpp"

namespace fp4moe::cuda::linear_fp4 {
namespace {

constexpr int kRowsW = kGenericRowsW;  // weight rows (GEMM N) per CTA
constexpr int kRowsT = kGenericRowsT;  // tokens per CTA iteration
constexpr int kStepK = kGenericStepK;  // K per pipeline step
constexpr int kThreads = 128;          // 4 warps, each 32 weight rows x kRowsT tokens
constexpr int kLd = kStepK + 8;        // bf16 row pitch in smem (pad: conflict-free fragments)
constexpr int kLdC = kRowsW + 4;       // float pitch of the epilogue tile
constexpr int kHalfW = kRowsW / 2;     // SiluMul: gate rows per CTA (and as many up rows)
constexpr int kSmemMain = (kRowsW + kRowsT) * kLd * 2;   // 23,040 B
constexpr int kSmemEpi = kRowsT * kLdC * 4;              // 16,896 B
constexpr int kSmemBytes = kSmemMain > kSmemEpi ? kSmemMain : kSmemEpi;
constexpr int kWChunks = kRowsW * (kStepK / 16) / kThreads;  // 16-element FP4 chunks per thread (4)
constexpr int kXChunks = kRowsT * (kStepK / 8) / kThreads;   // 8-element BF16 chunks per thread (4)
static_assert(kWChunks * kThreads == kRowsW * kStepK / 16);
static_assert(kXChunks * kThreads == kRowsT * kStepK / 8);
static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");

template <bool kMx>
__global__ void __launch_bounds__(kThreads) generic_fp4_grouped_gemm_kernel(GenericParams p) {
  const auto* x = static_cast<const __nv_bfloat16*>(p.x);
  auto* y = static_cast<__nv_bfloat16*>(p.y);
  const int e = blockIdx.y;
  const int m_begin = p.offsets[e];
  const int m_end = p.offsets[e + 1];
  if (m_end <= m_begin) return;  // experts without tokens cost one load

  __shared__ __align__(16) unsigned char smem[kSmemBytes];
  __nv_bfloat16* ws = reinterpret_cast<__nv_bfloat16*>(smem);   // [kRowsW][kLd] decoded weights
  __nv_bfloat16* xs = ws + kRowsW * kLd;                         // [kRowsT][kLd] tokens
  float* cs = reinterpret_cast<float*>(smem);                    // [kRowsT][kLdC] epilogue (aliases)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;
  const bool silu = p.epilogue == kEpiSiluMul;
  const int half = p.n / 2;
  constexpr int kBlock = kMx ? 32 : 16;
  const int scale_cols = p.k / kBlock;
  const int64_t e_rows = int64_t(e) * p.n;
  const float gscale = p.global ? p.global[e] : 1.0f;

  // Local weight row r of this CTA -> global row in [0, N), or -1 past the end.
  auto weight_row = [&](int r) -> int {
    if (silu) {
      const int j = blockIdx.x * kHalfW + (r % kHalfW);
      return j < half ? (r < kHalfW ? j : half + j) : -1;
    }
    const int n = blockIdx.x * kRowsW + r;
    return n < p.n ? n : -1;
  };

  // This thread's weight chunks are fixed for the whole CTA: precompute their rows.
  int w_row[kWChunks];
#pragma unroll
  for (int i = 0; i < kWChunks; ++i) w_row[i] = weight_row((tid + i * kThreads) / (kStepK / 16));

  uint2 w_reg[kWChunks];
  uint32_t s_reg[kWChunks];
  uint4 x_reg[kXChunks];

  auto load_step = [&](int m0, int k0) {
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
      const int c = tid + i * kThreads;
      const int kk = k0 + (c % (kStepK / 16)) * 16;
      w_reg[i] = make_uint2(0u, 0u);
      s_reg[i] = 0u;
      if (w_row[i] >= 0 && kk < p.k) {
        const int64_t row = e_rows + w_row[i];
        w_reg[i] = *reinterpret_cast<const uint2*>(p.packed + row * (p.k / 2) + kk / 2);
        s_reg[i] = p.scales[row * scale_cols + kk / kBlock];
      }
    }
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = tid + i * kThreads;
      const int m = m0 + c / (kStepK / 8);
      const int kk = k0 + (c % (kStepK / 8)) * 8;
      x_reg[i] = make_uint4(0u, 0u, 0u, 0u);
      if (m < m_end && kk < p.k)
        x_reg[i] = *reinterpret_cast<const uint4*>(x + int64_t(m) * p.k + kk);
    }
  };
  auto store_step = [&] {
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
      const int c = tid + i * kThreads;
      const int r = c / (kStepK / 16), part = c % (kStepK / 16);
      uint32_t v[8];
      decode16_bf16(w_reg[i], scale_to_float<kMx>(s_reg[i]), v);
      uint4* dst = reinterpret_cast<uint4*>(ws + r * kLd + part * 16);
      dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
      dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = tid + i * kThreads;
      const int r = c / (kStepK / 8), part = c % (kStepK / 8);
      *reinterpret_cast<uint4*>(xs + r * kLd + part * 8) = x_reg[i];
    }
  };

  for (int m0 = m_begin; m0 < m_end; m0 += kRowsT) {
    float acc[2][kRowsT / 8][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int b = 0; b < kRowsT / 8; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

    load_step(m0, 0);
    for (int k0 = 0; k0 < p.k; k0 += kStepK) {
      __syncthreads();  // previous step's (or previous epilogue's) smem reads are done
      store_step();
      __syncthreads();
      if (k0 + kStepK < p.k) load_step(m0, k0 + kStepK);  // in flight during the MMAs
#pragma unroll 1
      for (int ks = 0; ks < kStepK / 16; ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const __nv_bfloat16* base = ws + (warp * 32 + mt * 16 + g) * kLd + ks * 16 + tq * 2;
          a[mt][0] = *reinterpret_cast<const uint32_t*>(base);
          a[mt][1] = *reinterpret_cast<const uint32_t*>(base + 8 * kLd);
          a[mt][2] = *reinterpret_cast<const uint32_t*>(base + 8);
          a[mt][3] = *reinterpret_cast<const uint32_t*>(base + 8 * kLd + 8);
        }
#pragma unroll
        for (int nt = 0; nt < kRowsT / 8; ++nt) {
          const __nv_bfloat16* base = xs + (nt * 8 + g) * kLd + ks * 16 + tq * 2;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(base);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(base + 8);
          prims::mma_bf16_16816(acc[0][nt], a[0], b0, b1);
          prims::mma_bf16_16816(acc[1][nt], a[1], b0, b1);
        }
      }
    }

    // Epilogue: stage acc * global as cs[token][weight row], then write rows of y.
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kRowsT / 8; ++nt) {
        const int r = warp * 32 + mt * 16 + g, t = nt * 8 + tq * 2;
        cs[t * kLdC + r] = acc[mt][nt][0] * gscale;
        cs[(t + 1) * kLdC + r] = acc[mt][nt][1] * gscale;
        cs[t * kLdC + r + 8] = acc[mt][nt][2] * gscale;
        cs[(t + 1) * kLdC + r + 8] = acc[mt][nt][3] * gscale;
      }
    __syncthreads();
    const int rows_t = min(kRowsT, m_end - m0);
    if (silu) {
      for (int idx = tid; idx < rows_t * kHalfW; idx += kThreads) {
        const int t = idx / kHalfW, c = idx % kHalfW;
        const int j = blockIdx.x * kHalfW + c;
        if (j >= half) continue;
        const float gate = cs[t * kLdC + c], up = cs[t * kLdC + kHalfW + c];
        const float v = gate / (1.0f + __expf(-gate)) * up;
        y[int64_t(m0 + t) * p.n_out + j] = __float2bfloat16_rn(v);
      }
    } else {
      for (int idx = tid; idx < rows_t * kRowsW; idx += kThreads) {
        const int t = idx / kRowsW, c = idx % kRowsW;
        const int n = blockIdx.x * kRowsW + c;
        if (n >= p.n) continue;
        float v = cs[t * kLdC + c];
        if (p.epilogue == kEpiRowScale) v *= p.row_scale[m0 + t];
        y[int64_t(m0 + t) * p.n_out + n] = __float2bfloat16_rn(v);
      }
    }
    // The next iteration's first __syncthreads protects cs before smem is reused.
  }
}

}  // namespace
}  // namespace fp4moe::cuda::linear_fp4
