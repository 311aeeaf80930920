// The cuBLASLt / cuBLAS handles of the BF16 dense GEMMs (cuda/linear's BF16 kernel, and the
// runner's per-head strided-batched products), with their workspaces set once so that every
// call can be captured in a CUDA graph, and the cuBLASLt algorithm cached per shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include <cuda_runtime_api.h>

#include "cuda/common/device_buffer.hpp"

namespace fp4moe::cuda::linear {

class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y [T, N] (row stride ldy; BF16 or FP32) = x [T, K] (BF16, row stride ldx) · W [N, K]ᵀ (BF16).
  // ldx / ldy 0: dense. The algorithm is chosen at the first call of a shape (cuBLASLt heuristic).
  void gemm(const uint16_t* w, int N, int K, const uint16_t* x, int64_t ldx, int T, void* y, bool y_f32, int64_t ldy,
            cudaStream_t s);
  // Column-major strided batched C_b (m × n) = op(A_b) (m × k) · B_b (k × n), BF16 in, FP32
  // accumulate, BF16 or FP32 out (cublasGemmStridedBatchedEx); a_t: A stored k × m (transposed).
  void batched(bool a_t, int m, int n, int k, const void* A, int64_t lda, int64_t sA, const void* B, int64_t ldb,
               int64_t sB, void* C, bool c_f32, int64_t ldc, int64_t sC, int batch, cudaStream_t s);
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

 private:
  struct Plan;
  void* lt_ = nullptr;    // cublasLtHandle_t
  void* blas_ = nullptr;  // cublasHandle_t
  DeviceBuffer ws_, ws_blas_;
  std::map<std::tuple<int, int, int, int64_t, int64_t, bool>, std::shared_ptr<Plan>> plans_;
};

}  // namespace fp4moe::cuda::linear
