// The CUDA op set (model/ops.hpp) of the GPU runner: the runner's device weights, step
// workspace (Scratch), metadata and stream; the launches of src/cuda's families. Bound to one
// forward (T tokens of R requests, the device metadata already uploaded); it only enqueues, so
// the same ops run eager and under graph capture. Activations: x FP32, h / o BF16 [T, hidden]
// in the runner's workspace; tokens and logits rows are the step metadata on the device.
// The MTP layer's ops (its norms, eh_proj, its block, its head) run where the runner loaded it
// (RunnerOptions::mtp; else can_implement says so): its block's weights and KV layer are
// GpuRunner::Impl::layer / kv_layer of a LayerRef with mtp set; its MoE routing is not counted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/gpu_runner_impl.hpp"
#include "cuda/common/cuda_check.hpp"
#include "model/ops.hpp"

namespace fp4moe::engine::gpu {

// The BF16 activations' raw bits (the kernels take uint16_t*); throws unless v is BF16.
inline uint16_t* bf16_bits(const TensorView& v) {
  FP4MOE_CHECK(v.dtype == DType::BF16, "a BF16 view was expected, got {}", v.describe());
  return static_cast<uint16_t*>(v.data);
}

// Device → host copy of n values (eager only: synchronises the stream); the ops' StepChoices downloads.
template <typename V>
std::vector<V> download(const V* src, size_t n, cudaStream_t stream) {
  std::vector<V> v(n);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(v.data(), src, n * sizeof(V), cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return v;
}

class CudaOps final : public model::Ops {
 public:
  // max_ctx (>= every position + 1) sizes the indexer grid and the fast attention's split grid;
  // decode: every request has exactly one token (token t = request t); choices (eager only):
  // the step's routing and top-k downloaded per layer when set.
  CudaOps(GpuRunner::Impl& m, int T, int R, int max_ctx, bool decode, StepChoices* choices);

  std::string can_implement(const model::EmbedArgs& a) const override;
  std::string can_implement(const model::RmsNormArgs& a) const override;
  std::string can_implement(const model::AttentionArgs& a) const override;
  std::string can_implement(const model::AddArgs& a) const override;
  std::string can_implement(const model::FfnArgs& a) const override;
  std::string can_implement(const model::LinearArgs& a) const override;
  std::string can_implement(const model::HeadArgs& a) const override;

  void run(const model::EmbedArgs& a) override;
  void run(const model::RmsNormArgs& a) override;
  void run(const model::AttentionArgs& a) override;  // cuda_ops_attention.cpp
  void run(const model::AddArgs& a) override;
  void run(const model::FfnArgs& a) override;
  void run(const model::LinearArgs& a) override;
  void run(const model::HeadArgs& a) override;  // gather, lm_head, grammar masks, greedy argmax
  void read(const TensorView& src, float* dst) override;  // eager only (synchronises)
  void mark(model::Stage stage, int64_t layer) override;

 private:
  // The absorbed attention over KV layer kvl, s.ql / s.q's rope part into s.ol (topk: the DSA
  // slots, or null for dense causal attention): the fast kernels where chosen, else the own.
  void mla(const KvLayerView& kvl, const int32_t* topk);
  void dense_mlp(const DenseMlp& mlp, const uint16_t* h, uint16_t* out);
  // This step's tokens per expert of MoE layer l from its routing ids [T, k] (real tokens only).
  void count_layer(int64_t l, const int32_t* ids, int k);
  // "" when v is a device view of T rows of `hidden` values of dtype `dt`, contiguous rows.
  std::string activation(const TensorView& v, const char* what, DType dt) const;

  GpuRunner::Impl& m_;
  int T_, R_, max_ctx_;
  bool decode_;
  StepChoices* choices_;
};

}  // namespace fp4moe::engine::gpu
