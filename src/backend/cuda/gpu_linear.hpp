// The model runner's linears on the GPU: every linear of the checkpoint gets a kernel once, at
// load, by its format and shape:
//   - NVFP4 / MXFP4 → our FP4 grouped GEMM as the E = 1 case (moe::upload_expert_gemm, the
//     sm_90a kernels where N % 128 == 0 and K % 64 == 0, else the Generic kernel);
//   - BF16 → cuBLASLt (BF16 in, FP32 accumulate, BF16 or FP32 out);
//   - F32, or an FP4 shape no FP4 kernel takes (e.g. kv_a_proj_with_mqa's N = 576 on sm_90):
//     dequantized to BF16 at load → cuBLASLt, with one line per shape saying so.
// Blas holds the cuBLASLt / cuBLAS handles and their workspace (set once, so every call can be
// captured in a CUDA graph) and caches the cuBLASLt algorithm per shape.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <cuda_runtime_api.h>

#include "cpu/linear_cpu.hpp"
#include "cuda/common/device_buffer.hpp"
#include "moe/expert_gemm.hpp"

namespace fp4moe::engine::gpu {

class Loader;

class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y [T, N] (row stride ldy; BF16 or FP32) = x [T, K] (BF16, row stride ldx) · W [N, K]ᵀ (BF16).
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
  cuda::DeviceBuffer ws_, ws_blas_;
  std::map<std::tuple<int, int, int, int64_t, int64_t, bool>, std::shared_ptr<Plan>> plans_;
};

// What every linear call of a step shares: the handles, the FP4 GEMM's workspace and its
// device offsets {0, T} of the step's T tokens (the step metadata holds them).
struct LinearCtx {
  Blas* blas = nullptr;
  const int32_t* offsets = nullptr;
  void* fp4_workspace = nullptr;
  cudaStream_t stream = nullptr;
};

class GpuLinear {
 public:
  enum class Kind : uint8_t { Bf16Lt, Fp4 };
  GpuLinear() = default;
  // Uploads `v` (a view of the mmap'd checkpoint) for calls of up to max_tokens rows.
  // bf16_only: always the cuBLASLt path (rows that are not the step's T, FP32 outputs).
  GpuLinear(const cpu::LinearView& v, const std::string& name, int64_t max_tokens, Loader& loader, bool bf16_only);

  // y [T, n] = x [T, k] · Wᵀ. FP4 linears: T must be the step's token count (ctx.offsets) and
  // y BF16. ldx / ldy: row strides (0: dense).
  void run(const uint16_t* x, int T, void* y, bool y_f32, const LinearCtx& ctx, int64_t ldx = 0, int64_t ldy = 0) const;

  int64_t n = 0, k = 0;
  Kind kind = Kind::Bf16Lt;
  size_t bytes = 0;
  size_t fp4_workspace_bytes() const { return fp4_ ? fp4_->workspace_bytes() : 0; }
  const uint16_t* bf16() const { return static_cast<const uint16_t*>(bf16_.ptr()); }
  std::string describe() const;

 private:
  cuda::DeviceBuffer bf16_;
  std::unique_ptr<moe::ExpertGemmWeights> fp4_;
};

// A BF16 [n, k] host copy of any linear view (dequantized FP4 / converted F32 rows).
std::vector<uint16_t> linear_to_bf16(const cpu::LinearView& v);

}  // namespace fp4moe::engine::gpu
