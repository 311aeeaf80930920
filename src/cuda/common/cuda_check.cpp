#include "cuda/common/cuda_check.hpp"

#include "core/error.hpp"

namespace fp4moe::cuda {

void fail_cuda(cudaError_t err, const char* stmt, const char* file, int line) {
  std::string msg = fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err),
                                stmt, file, line);
  if (err == cudaErrorMemoryAllocation) throw OutOfMemory(std::move(msg));
  throw Error(std::move(msg));
}

void fail_cublas(cublasStatus_t st, const char* stmt, const char* file, int line) {
  throw Error(fmt::format("cuBLAS error {} ({}) in {} at {}:{}", cublasGetStatusName(st),
                          cublasGetStatusString(st), stmt, file, line));
}

}  // namespace fp4moe::cuda
