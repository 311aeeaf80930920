// A kernel launch with or without programmatic dependent launch (PDL): with it, the kernel's
// blocks may start launching while the kernel before it in the stream still runs, so a chain of
// short dependent kernels (a small-batch decode step) overlaps each launch with the previous
// kernel's tail. Only for kernels that call prims::pdl_wait() before their first global access
// (device_prims.cuh). Needs sm_90+; on older devices the launch is a plain one.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "cuda/common/device.hpp"

namespace fp4moe::cuda {

template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(bool pdl, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  const bool on = pdl && current_device().cc >= 90;
  cfg.attrs = on ? &attr : nullptr;
  cfg.numAttrs = on ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace fp4moe::cuda
