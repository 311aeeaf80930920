// Internal launchers of the linear-layout FP4 kernels (Generic GEMM, dequantize-to-BF16,
// the baseline's epilogue kernels). Plain structs, no validation: the host code in
// generic_nvfp4_grouped_gemm.cpp / dequant_cublas.cpp checks everything first. Kept free
// of fmt so the .cu files compile without it.
#pragma once

#include <cstdint>

#if !defined(FP4MOE_CUDA_EMU)  // the emulator test (generic kernel on the CPU) has no CUDA runtime
#include <cuda_runtime_api.h>
#endif

namespace fp4moe::cuda::linear_fp4 {

enum EpiCode : int { kEpiNone = 0, kEpiSiluMul = 1, kEpiRowScale = 2 };

// Generic grouped GEMM tile (the single config).
inline constexpr int kGenericRowsW = 128;  // weight rows (GEMM N) per CTA
inline constexpr int kGenericRowsT = 32;   // tokens per CTA iteration
inline constexpr int kGenericStepK = 64;   // K per pipeline step

struct GenericParams {
  const void* x = nullptr;               // [M_total, K] bf16
  const int32_t* offsets = nullptr;      // [E+1] device
  const uint8_t* packed = nullptr;       // [E, N, K/2]
  const uint8_t* scales = nullptr;       // [E, N, K/block]
  const float* global = nullptr;         // [E] or null (1)
  const float* row_scale = nullptr;      // [M_total] (RowScale)
  void* y = nullptr;                     // [M_total, n_out] bf16
  int num_experts = 0, n = 0, k = 0, n_out = 0;  // n_out = N, or N/2 with SiluMul
  int epilogue = kEpiNone;
  bool mx = false;                       // MXFP4 (block 32, E8M0) instead of NVFP4
};
#if !defined(FP4MOE_CUDA_EMU)
cudaError_t launch_generic_grouped_gemm(const GenericParams& p, cudaStream_t stream);
#endif

// Dequantize whole experts to BF16: out[slot] = decode(W[experts[slot]]), [N, K] each.
inline constexpr int kMaxDequantSlots = 256;
struct DequantParams {
  const uint8_t* packed = nullptr;       // [E, N, K/2]
  const uint8_t* scales = nullptr;       // [E, N, K/block]
  void* out = nullptr;                   // [slots, N, K] bf16
  int64_t n = 0, k = 0;
  int slots = 0;
  bool mx = false;
  int32_t experts[kMaxDequantSlots] = {};  // expert of each slot (passed by value)
};
#if !defined(FP4MOE_CUDA_EMU)
cudaError_t launch_dequant_experts(const DequantParams& p, cudaStream_t stream);

// y[m, j] = bf16(SiLU(t[m, j]) * t[m, half + j]) for rows [row_begin, row_end); t is [*, 2*half].
cudaError_t launch_silu_mul_rows(const void* t, void* y, int64_t row_begin, int64_t row_end,
                                 int half, cudaStream_t stream);
// y[m, n] = bf16(y[m, n] * row_scale[m]) in place for rows [row_begin, row_end).
cudaError_t launch_row_scale_rows(void* y, const float* row_scale, int64_t row_begin,
                                  int64_t row_end, int n, cudaStream_t stream);
#endif

}  // namespace fp4moe::cuda::linear_fp4
