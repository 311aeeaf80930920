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
  int epilogue = 0;                      // int(Epilogue), core/gemm_epilogue.hpp
  bool mxfp4 = false;
  bool decode = false;                   // the mma.sync decode kernel (block_n 8, 16, 32)
  int force_splits = 0;                  // split-K factor override (MoeGemmArgs::force_splits), 0: auto
  int sm_count = 0;                      // SMs of the current device (cuda/common/device.hpp)
};

void launch_grouped_gemm(const Sm90GemmLaunch& a, cudaStream_t stream);
void launch_grouped_gemm_decode(const Sm90GemmLaunch& a, cudaStream_t stream);

// What the compiled kernel of (decode or wgmma, block_n) asks of the current device, from the
// runtime (cudaFuncGetAttributes, cudaOccupancyMaxActiveBlocksPerMultiprocessor after the
// dynamic shared-memory opt-in): an independent check of sm90_tile_layout.hpp's arithmetic.
// Returns ctas_per_sm = 0 and the other fields 0 for a block_n that is not instantiated.
struct Sm90KernelResources {
  int static_smem = 0;       // statically declared shared memory of the kernel
  int max_dynamic_smem = 0;  // the opt-in the launcher sets (cudaFuncAttributeMaxDynamicSharedMemorySize)
  int regs = 0;              // registers per thread
  int max_threads = 0;       // per block, as compiled (__launch_bounds__)
  int ctas_per_sm = 0;       // resident CTAs per SM with `dynamic_smem` bytes of dynamic shared memory
};
Sm90KernelResources sm90_kernel_resources(bool decode, int block_n, size_t dynamic_smem);
Sm90KernelResources sm90_decode_kernel_resources(int block_n, size_t dynamic_smem);  // (the decode half)

}  // namespace fp4moe::cuda::sm90
