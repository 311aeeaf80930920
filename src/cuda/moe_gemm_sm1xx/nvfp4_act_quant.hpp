// Activations to real NVFP4 for the Blackwell block-scaled GEMMs, and the small kernels beside
// them (nvfp4_act_quant.cu). Plain CUDA (no tensor-core instructions), compiled for every arch
// the build has, so the H200 tests it against the CPU quantizer; the GEMMs that read its output
// are compiled, not run.
//
// Quantization is format/fp4.cpp's quantize_nvfp4 (ModelOpt) with the checkpoint's static
// per-tensor global g (the linear's `input_scale`, a device scalar): per 16 elements along K,
// s = amax / (6 g) (0 -> 1), clamped to [2^-9, 448], E4M3 (RNE, saturating); codes E2M1 of
// x / (e4m3(s) * g) (round half to even, saturating), element 2j in the low nibble. Codes go
// to [rows, K/2]; scale factors to CUTLASS's 128x4-atom layout (sm1xx_bs_layout.hpp), each
// expert's rows on their own atoms (grouped: act_sf_row_base; slabs: per-expert blocks).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::sm1xx {

struct ActQuantArgs {
  const void* x = nullptr;           // BF16 [rows, K] (silu_mul: [rows, 2K], gate | up halves)
  int64_t rows = 0;                  // rows of x (the permuted batch); rows past offsets[end] are skipped
  int k = 0;                         // K of the GEMM that reads the output (multiple of 64)
  const int32_t* offsets = nullptr;  // [E + 1] device, absolute row offsets per expert
  int expert_begin = 0, expert_end = 0;  // the experts of this call
  const float* global = nullptr;     // device scalar g (input_scale)
  uint8_t* out_fp4 = nullptr;        // grouped: [rows, K/2]; slabs: [groups, max_n, K/2]
  uint8_t* out_sf = nullptr;         // grouped: act_sf_rows_bound rows; slabs: groups * sf_rows(max_n) rows
  int max_n = 0;                     // 0: grouped layout; > 0: per-expert slabs of max_n rows
  bool silu_mul = false;             // quantize SiLU(gate) * up (each rounded to BF16 first, as the
                                     // W4A16 path's SiluMul output is) instead of x
};
void quantize_act_nvfp4(const ActQuantArgs& a, cudaStream_t stream);

// The GEMM output's last pass, for the rows r of experts [expert_begin, expert_end):
//   y[r, :] = src[r', :] * (row_scale ? row_scale[r] : 1), or with silu_mul
//   y[r, j] = SiLU(src[r', j]) * src[r', n + j] (src rows 2n wide: gate | up; FP32, rounded to BF16),
// where r' = r in the grouped layout (in place allowed without silu_mul) and the row of r in
// the per-expert slabs of max_n rows when max_n > 0. BF16, n a multiple of 8.
struct RowGatherArgs {
  const void* src = nullptr;
  void* y = nullptr;
  int64_t rows = 0;
  int n = 0;                         // columns of y
  const int32_t* offsets = nullptr;
  int expert_begin = 0, expert_end = 0;
  const float* row_scale = nullptr;  // [rows] routing weights, or null
  int max_n = 0;
  bool silu_mul = false;
};
void gather_scale_rows_bf16(const RowGatherArgs& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::sm1xx
