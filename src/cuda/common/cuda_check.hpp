// Checked CUDA / cuBLAS(Lt) calls: one [[noreturn]] reporter with the statement,
// file:line and the library's error name and string. Every launch is checked too.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace fp4moe::cuda {

// What fail_cuda throws for cudaErrorMemoryAllocation, so that a caller that can say more (the
// GPU runner names its memory plan) catches this one error and lets every other pass.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void fail_cuda(cudaError_t err, const char* stmt, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t st, const char* stmt, const char* file, int line);

}  // namespace fp4moe::cuda

#define FP4MOE_CUDA_CHECK(stmt)                                                      \
  do {                                                                               \
    cudaError_t fp4moe_err_ = (stmt);                                                \
    if (fp4moe_err_ != cudaSuccess) [[unlikely]]                                     \
      ::fp4moe::cuda::fail_cuda(fp4moe_err_, #stmt, __FILE__, __LINE__);             \
  } while (0)

#define FP4MOE_CUBLAS_CHECK(stmt)                                                    \
  do {                                                                               \
    cublasStatus_t fp4moe_st_ = (stmt);                                              \
    if (fp4moe_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                            \
      ::fp4moe::cuda::fail_cublas(fp4moe_st_, #stmt, __FILE__, __LINE__);            \
  } while (0)

// After a <<<>>> launch: checks the launch itself (not its completion).
#define FP4MOE_CUDA_CHECK_LAUNCH() FP4MOE_CUDA_CHECK(cudaGetLastError())
