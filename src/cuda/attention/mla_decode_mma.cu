// Launches of the MLA decode kernels (mla_decode_mma.cuh; the warp-specialized FP8 one:
// mla_decode_ws.cuh), one instantiation per cache type.
// Compiled for every arch in CMAKE_CUDA_ARCHITECTURES (mma.sync, cp.async, ldmatrix, the
// E4M3 -> FP16 cvt of sm_89+); mla_decode_can_implement checks the shared memory at run time.
#include "cuda/attention/mla_decode_mma.cuh"
#include "cuda/attention/mla_decode_ws.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/launch.cuh"

namespace fp4moe::cuda::attention::decode {

cudaError_t launch(bool fp8, const Params& p, int items, int head_groups, int merges, cudaStream_t stream, bool pdl,
                   bool wgmma, bool ws, bool ws_q_regs) {
  if (ws && !fp8) return cudaErrorInvalidValue;  // the planner refuses it first (can_implement)
  const size_t smem = smem_bytes(fp8, wgmma, ws);
  auto kernel = ws      ? (ws_q_regs ? mla_decode_ws_kernel<true> : mla_decode_ws_kernel<false>)
                : wgmma ? (fp8 ? mla_decode_kernel<true, true> : mla_decode_kernel<false, true>)
                        : (fp8 ? mla_decode_kernel<true> : mla_decode_kernel<false>);
  static DeviceOnce opt_in[6];  // the shared-memory opt-in, once per device and kernel
  cudaError_t st = cudaSuccess;
  opt_in[ws ? 4 + (ws_q_regs ? 1 : 0) : (wgmma ? 2 : 0) + (fp8 ? 1 : 0)](
      [&] { st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); });
  if (st != cudaSuccess) return st;
  st = launch_kernel(pdl, kernel, dim3(unsigned(items), unsigned(head_groups)), dim3(ws ? CfgWs::kThreads : kThreads),
                     smem, stream, p);
  if (st != cudaSuccess || merges == 0) return st;
  return launch_kernel(pdl, mla_merge_kernel, dim3(unsigned(merges), unsigned(p.num_heads)), dim3(kMergeThreads), 0,
                       stream, p);
}

}  // namespace fp4moe::cuda::attention::decode
