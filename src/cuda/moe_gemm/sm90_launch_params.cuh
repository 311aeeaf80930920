// Host helpers both sm90 launchers share (sm90_nvfp4_grouped_gemm.cu, ..._decode.cu): the
// kernel parameters from an Sm90GemmLaunch, the split-K state, the grid bound, the per-device
// shared-memory opt-in and the compiled kernels' resources.
#pragma once

#include <algorithm>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/moe_gemm/sm90_grouped_common.cuh"
#include "cuda/moe_gemm/sm90_launch.hpp"

namespace fp4moe::cuda::sm90 {

// Upper bound of the (expert, token tile, row tile) tiles: token tiles <= rows and
// <= (non-empty experts <= min(E, rows)) + rows / block_n.
inline long long sm90_max_tiles(const Sm90GemmLaunch& a, int block_n) {
  const long long rows = a.m_rows;
  const long long token_tiles = std::min<long long>(rows, std::min<long long>(a.num_experts, rows) + rows / block_n);
  return token_tiles * (a.n / kBlockM);
}

// Parameters for a launch of `block_n` tokens per tile. Split-K only where the tiles cannot
// fill the SMs (at most one tile per SM: e.g. one expert's 32 row tiles): measured on the
// H200 (bench/RESULTS.md), splitting 256..432 decode tiles over 396 CTA slots was slower or
// no faster than not splitting (the partial round trip and its fence cost more than the
// better balance gains), and a split-capable launch pays a counter memset. With a split-K
// workspace the counters are zeroed on `stream` and the kernel may split up to
// kSm90MaxSplits ways.
inline GroupedGemmParams sm90_params(const Sm90GemmLaunch& a, int block_n, cudaStream_t stream) {
  GroupedGemmParams p;
  p.tiles = a.tiles;
  p.global_scale = a.global_scale;
  p.act_global = a.act_global;
  p.offsets = a.offsets;
  p.row_scale = a.row_scale;
  p.y = static_cast<__nv_bfloat16*>(a.y);
  p.num_experts = a.num_experts;
  p.n = a.n;
  p.k = a.k;
  p.y_ld = a.y_ld;
  p.stages = a.stages;
  p.epilogue = a.epilogue;
  p.mxfp4 = a.mxfp4 ? 1 : 0;
  const bool split = a.force_splits > 0 || sm90_max_tiles(a, block_n) < a.sm_count;
  if (sm90_split_k_capable(block_n) && a.split_ws && split) {
    p.max_splits = kSm90MaxSplits;
    p.partials = static_cast<float*>(a.split_ws);
    p.counters = reinterpret_cast<int*>(static_cast<uint8_t*>(a.split_ws) + kSm90SplitPartialBudget);
    p.split_cap_units = sm90_split_cap_units(block_n);
    p.force_splits = a.force_splits;
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, size_t(p.split_cap_units) * sizeof(int), stream));
  }
  return p;
}

// Persistent grid: `ctas_per_sm` per SM, but no more than the most (tile, split) units there
// can be.
inline int sm90_grid(const Sm90GemmLaunch& a, const GroupedGemmParams& p, int block_n, int ctas_per_sm) {
  const long long max_units = sm90_max_tiles(a, block_n) * p.max_splits;
  return int(std::min<long long>((long long)a.sm_count * ctas_per_sm, max_units));
}

// The dynamic shared-memory opt-in of kKernel (up to `bytes`), once per device.
template <auto kKernel>
void set_max_dynamic_smem_once(int bytes) {
  static DeviceOnce once;
  once([bytes] {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  });
}

// What kKernel asks of the current device (sm90_launch.hpp, Sm90KernelResources), after its opt-in.
template <auto kKernel>
Sm90KernelResources kernel_resources(int opt_in_bytes, int threads, size_t dynamic_smem) {
  set_max_dynamic_smem_once<kKernel>(opt_in_bytes);
  cudaFuncAttributes fa{};
  FP4MOE_CUDA_CHECK(cudaFuncGetAttributes(&fa, kKernel));
  Sm90KernelResources r;
  r.static_smem = int(fa.sharedSizeBytes);
  r.max_dynamic_smem = fa.maxDynamicSharedSizeBytes;
  r.regs = fa.numRegs;
  r.max_threads = fa.maxThreadsPerBlock;
  FP4MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.ctas_per_sm, kKernel, threads, dynamic_smem));
  return r;
}

}  // namespace fp4moe::cuda::sm90
