// The launch of the device schedule kernel of mla_fi_schedule.hpp (mla_fi_schedule.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/attention/mla_fi_schedule.hpp"

namespace fp4moe::cuda::attention::fi_sched {

// fi_sched::threads(p) threads, each fi_sched::write(p, i).
cudaError_t launch(const Params& p, cudaStream_t stream, bool pdl = false);  // pdl: cuda/common/launch.cuh

}  // namespace fp4moe::cuda::attention::fi_sched
