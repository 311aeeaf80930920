// The CPU op set (model/ops.hpp) over the host checkpoint: src/cpu's kernels, FP32 activations
// and accumulation (the reference the transformers goldens check, and the embedded default).
// Bound to one step: the model's weights and options, the step's KV pool and batch, and the
// caller-owned arena every op allocates its scratch in (Model::step resets it per step).
#pragma once

#include <chrono>
#include <cstdint>

#include "core/arena.hpp"
#include "core/paged_kv.hpp"
#include "model/kv_pool.hpp"
#include "model/model.hpp"
#include "model/ops.hpp"

namespace fp4moe::model {

// State that lives across the layers of one CPU step (in the step's arena).
struct CpuStepState {
  float* cos = nullptr;     // [T, qk_rope_dim / 2]
  float* sin = nullptr;     // [T, qk_rope_dim / 2]
  int32_t* topk = nullptr;  // [T, topk_k]: the last "full" indexer layer's selection
  int64_t topk_k = 0;
  bool have_topk = false;
};

class CpuOps final : public Ops {
 public:
  // form: the attention form of every request (Auto: expanded for >1 token, absorbed for 1).
  CpuOps(const MlaModelConfig& c, const ModelWeights& w, const ModelOptions& opt, Arena& arena, HostKvPool& kv,
         const KvBatchView& batch, AttentionForm form);

  // Arena reset, the step's RoPE tables and top-k buffer (before the executor's allocations).
  void begin_step();

  std::string can_implement(const EmbedArgs& a) const override;
  std::string can_implement(const RmsNormArgs& a) const override;
  std::string can_implement(const AttentionArgs& a) const override;
  std::string can_implement(const AddArgs& a) const override;
  std::string can_implement(const FfnArgs& a) const override;
  std::string can_implement(const LinearArgs& a) const override;
  std::string can_implement(const HeadArgs& a) const override;

  void run(const EmbedArgs& a) override;
  void run(const RmsNormArgs& a) override;
  void run(const AttentionArgs& a) override;  // cpu_ops_attention.cpp
  void run(const AddArgs& a) override;
  void run(const FfnArgs& a) override;
  void run(const LinearArgs& a) override;
  void run(const HeadArgs& a) override;
  void read(const TensorView& src, float* dst) override;
  void mark(Stage stage, int64_t layer) override;  // per-layer times in the debug log

 private:
  const LayerWeights& layer_weights(const LayerRef& ref) const;
  int threads() const;

  const MlaModelConfig& cfg_;
  const ModelWeights& w_;
  const ModelOptions& opt_;
  Arena& arena_;
  HostKvPool& kv_;
  const KvBatchView& batch_;
  AttentionForm form_;
  CpuStepState s_;
  // Debug timing of a block (mark): its start, the end of its attention half.
  std::chrono::steady_clock::time_point block_t0_, block_t1_;
  int64_t block_layer_ = -1;
  bool block_moe_ = false;
};

}  // namespace fp4moe::model
