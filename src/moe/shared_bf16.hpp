// The MoE layer's shared expert when its weights are BF16 (NVIDIA's NVFP4 checkpoints keep the
// shared expert unquantized): a dense MLP on cuBLASLt, enqueued on the layer's stream inside the
// layer's workspace (graph-capturable, no allocation per call):
//
//   gu [T, 2·SI] f32 = x [T, H] · W13ᵀ     cuBLASLt, BF16 in, FP32 accumulate, FP32 out
//   h  [T, SI]  bf16 = SiLU(gate) · up      cuda::silu_mul_rows (one rounding, as the FP4
//                                           GEMM's SiluMul epilogue and the CPU layer)
//   ys [T, H]    f32 = h · W2ᵀ              cuBLASLt, FP32 out: the combine adds it unrounded
//
// The cuBLASLt algorithm of each GEMM is chosen once per tokens bucket at construction (the
// heuristic's first algorithm for the bucket's largest T that also runs its smallest T), so a
// forward only fills two stack layouts and launches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "format/moe_layer.hpp"

namespace fp4moe::moe {

class SharedMlpBf16 {
 public:
  // w13 [1, 2·SI, H] (gate rows, then up rows), w2 [1, H, SI], both BF16; SI % 4 == 0, H % 8 == 0.
  // Uploads the weights (synchronous) and picks the algorithms for 1..max_tokens tokens.
  SharedMlpBf16(const ExpertStack& w13, const ExpertStack& w2, int64_t max_tokens);
  ~SharedMlpBf16();
  SharedMlpBf16(const SharedMlpBf16&) = delete;
  SharedMlpBf16& operator=(const SharedMlpBf16&) = delete;

  // Scratch bytes of a call of up to `tokens` tokens (gu, h and the cuBLASLt workspace).
  size_t scratch_bytes(int64_t tokens) const;
  // ys [T, H] f32 = the shared MLP of x [T, H] bf16; scratch: 256-byte aligned,
  // scratch_bytes(T) bytes. Enqueue only, on `stream`.
  void run(const uint16_t* x, int64_t tokens, float* ys, void* scratch, cudaStream_t stream) const;

  size_t weight_bytes() const;  // both matrices, BF16
  std::string describe() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::moe
