#include "cuda/attention/mla_fi_schedule_launch.hpp"

#include "cuda/common/device_prims.cuh"
#include "cuda/common/launch.cuh"

namespace fp4moe::cuda::attention::fi_sched {
namespace {

__global__ void fi_schedule_kernel(Params p, int n) {
  prims::pdl_wait();  // its arrays were read by the previous run's attention kernel
  prims::pdl_release();
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) write(p, i);
}

}  // namespace

cudaError_t launch(const Params& p, cudaStream_t stream, bool pdl) {
  const int n = threads(p);
  return launch_kernel(pdl, fi_schedule_kernel, dim3(unsigned((n + 127) / 128)), dim3(128), 0, stream, p, n);
}

}  // namespace fp4moe::cuda::attention::fi_sched
