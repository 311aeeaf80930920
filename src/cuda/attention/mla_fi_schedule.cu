#include "cuda/attention/mla_fi_schedule_launch.hpp"

namespace fp4moe::cuda::attention::fi_sched {
namespace {

__global__ void fi_schedule_kernel(Params p, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) write(p, i);
}

}  // namespace

cudaError_t launch(const Params& p, cudaStream_t stream) {
  const int n = threads(p);
  fi_schedule_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(p, n);
  return cudaGetLastError();
}

}  // namespace fp4moe::cuda::attention::fi_sched
