// Host entry of the sm_90a kernel (sm90_nvfp4_grouped_gemm.cu, built for 90a only).
// Called by moe_gemm.cu when FP4MOE_HAVE_SM90 is defined; plain C++, no CUDA-only types.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::sm90 {

struct Sm90GemmLaunch {
  const void* x_map = nullptr;           // CUtensorMap (128 B, host memory) over x [m_rows, k] bf16:
                                         // box {64, block_n}, 128-byte swizzle (make_x_tensor_map)
  const uint8_t* tiles = nullptr;        // re-laid weights
  const float* global_scale = nullptr;   // [E]
  const float* act_global = nullptr;     // device scalar or null
  const int32_t* offsets = nullptr;      // [E+1]
  const float* row_scale = nullptr;      // [m_rows]
  void* y = nullptr;                     // [m_rows, y_ld] bf16
  int num_experts = 0, n = 0, k = 0, m_rows = 0, y_ld = 0;
  int block_n = 0, stages = 0;
  void* split_ws = nullptr;              // sm90_split_workspace_bytes(block_n) bytes, or null: no split-K
  int epilogue = 0;                      // sm90::EpilogueKind
  bool mxfp4 = false;
  bool decode = false;                   // the mma.sync decode kernel (block_n 8, 16, 32)
  int force_splits = 0;                  // split-K factor override (FP4MOE_SM90_SPLITS), 0: auto
};

void launch_grouped_gemm(const Sm90GemmLaunch& a, cudaStream_t stream);
void launch_grouped_gemm_decode(const Sm90GemmLaunch& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::sm90
