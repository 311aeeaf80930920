// Launcher and the explicit instantiations (block_n = 16, 64, 128, 256) of the sm_90a
// NVFP4/MXFP4 grouped GEMM. Shapes, pointers and the tensor map were checked / built by the
// host code (moe_gemm.cpp): this file only launches. (No core/error.hpp here: fmt's
// consteval format strings do not compile under nvcc in C++20.)
#include "cuda/moe_gemm/sm90_nvfp4_grouped_gemm.cuh"

#include <algorithm>
#include <mutex>

#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/sm90_launch.hpp"

namespace fp4moe::cuda::sm90 {
namespace {

int sm_count() {
  int dev = 0, n = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&dev));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

template <int kBlockN>
void launch_n(const Sm90GemmLaunch& a, cudaStream_t stream) {
  static_assert(sizeof(CUtensorMap) == 128);
  static std::once_flag once;
  std::call_once(once, [] {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp4_grouped_gemm_kernel<kBlockN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSm90MaxSmemPerBlock)));
  });
  const Sm90SmemLayout L = sm90_smem_layout(kBlockN, a.stages, a.num_experts);
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
  static const int sms = sm_count();
  const long long row_tiles = a.n / kBlockM;
  // Token tiles <= rows and <= (non-empty experts <= min(E, rows)) + rows / block_n.
  const long long rows = a.m_rows;
  const long long token_tiles = std::min<long long>(rows, std::min<long long>(a.num_experts, rows) + rows / kBlockN);
  const long long max_tiles = token_tiles * row_tiles;
  int max_splits = 1;
  if (sm90_split_k_capable(kBlockN) && a.split_ws) {
    max_splits = kSm90MaxSplits;
    p.partials = static_cast<float*>(a.split_ws);
    p.counters = reinterpret_cast<int*>(static_cast<uint8_t*>(a.split_ws) + kSm90SplitPartialBudget);
    p.split_cap_units = sm90_split_cap_units(kBlockN);
    p.max_splits = max_splits;
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, size_t(p.split_cap_units) * sizeof(int), stream));
  }
  const int grid = int(std::min<long long>(sms * sm90_ctas_per_sm(kBlockN), max_tiles * max_splits));
  sm90_fp4_grouped_gemm_kernel<kBlockN><<<grid, sm90_threads(kBlockN), L.total, stream>>>(*static_cast<const CUtensorMap*>(a.x_map), p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_grouped_gemm(const Sm90GemmLaunch& a, cudaStream_t stream) {
  if (a.m_rows <= 0) return;
  switch (a.block_n) {
    case 16: return launch_n<16>(a, stream);
    case 64: return launch_n<64>(a, stream);
    case 128: return launch_n<128>(a, stream);
    case 256: return launch_n<256>(a, stream);
    default: return;  // the caller checked sm90_block_n_supported
  }
}

}  // namespace fp4moe::cuda::sm90
