// The MLA model (GLM-5 / DeepSeek-V3 family) on the CPU: load = parse config.json, open the
// shards (mmap), bind every tensor in place; step = one forward pass over a batch of flat
// tokens from several requests with a paged KV cache (core/paged_kv.hpp).
//
// The step is model/layer_stack.hpp's forward (the layer stack every backend runs) with the
// CPU op set (model/cpu_ops.hpp): FP32 activations and accumulation throughout (the weights'
// own precision: BF16 / NVFP4 / MXFP4 / F32). Attention: requests with more than one token in
// the step (prefill) expand K/V from the latent (mla_expanded_cpu); single-token requests
// (decode) use the weight-absorbed form over the cached latent (mla_cpu). Options can force
// either form for every request (tests).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "core/paged_kv.hpp"
#include "core/tensor.hpp"
#include "format/checkpoint.hpp"
#include "model/kv_pool.hpp"
#include "model/layer_stack.hpp"
#include "model/model_config.hpp"
#include "model/weights.hpp"

namespace fp4moe::model {

enum class AttentionForm : uint8_t { Auto, Expanded, Absorbed };

// Sees every MoE layer's routing of a step: tokens_per_expert[e] = the step's tokens routed
// to routed expert e (what one grouped GEMM over the layer's experts computes).
using MoeRoutingObserver = std::function<void(int64_t layer, std::span<const int32_t> tokens_per_expert)>;

// Tests: another backend's discrete choices imposed on a step, so that near-ties that BF16
// rounding breaks the other way (MoE routing, the DSA top-k) choose alike and the continuous
// part can be compared; and the model's own choices observed. Called in step order, layer by
// layer; a null return keeps the model's own choice.
struct StepChoiceHooks {
  // [tokens, num_experts] router logits to route on instead of the layer's own.
  std::function<const float*(int64_t layer, int64_t tokens)> router_logits;
  // [tokens, k] key positions (-1 padded, ascending) instead of the layer's indexer top-k.
  std::function<const int32_t*(int64_t layer, int64_t tokens, int64_t k)> topk_positions;
  // After routing: the logits [tokens, E] and the chosen ids [tokens, top_k] of a MoE layer.
  std::function<void(int64_t layer, int64_t tokens, const float* logits, const int32_t* ids)> on_routing;
};

// Per-step choices of Model::step beyond the batch.
struct StepExtras {
  float* final_hidden = nullptr;  // [T, hidden]: every token's hidden state after the final norm (MTP input)
  // Every request in the weight-absorbed attention form, whatever its token count: the verify
  // step of speculative decoding, so that its rows equal one-token decode steps bit for bit.
  bool absorbed = false;
};

struct ModelOptions {
  int threads = 0;                       // 0: default_num_threads()
  AttentionForm attention = AttentionForm::Auto;
  MoeRoutingObserver on_moe_routing;     // null: not counted
  StepChoiceHooks hooks;                 // tests only
  // The MTP layer's BF16 routed experts quantized to NVFP4 at load (quantize_mtp_experts; the
  // backends' `--speculative-draft-model-quantization nvfp4`, their default with the MTP layer).
  bool quantize_mtp_experts = false;
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& opt = {});

  const MlaModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const Checkpoint& checkpoint() const { return *ck_; }
  // One line on what was loaded (architecture, layers, weight formats by role, load time).
  const std::string& description() const { return description_; }
  ModelOptions& options() { return opt_; }

  // A cache geometry for this model; layers with a "full" indexer hold index keys.
  PagedKvGeometry kv_geometry(int64_t page_size, int64_t num_pages, KvElem elem = KvElem::BF16) const;
  std::vector<bool> kv_index_layers() const;

  // One forward step. tokens: I32 [T] (host); batch: positions, kv_len and page tables of
  // every request (the pages must come from `kv`); the step's keys are appended to `kv` first.
  // logits_rows: flat token indices whose next-token logits are written to logits, F32
  // [logits_rows.size(), vocab] contiguous host, in that order (may be empty when no rows are
  // asked for). hidden: filled when non-null.
  void step(const TensorView& tokens, const KvBatchView& batch, HostKvPool& kv, const std::vector<int32_t>& logits_rows,
            const TensorView& logits, HiddenStates* hidden = nullptr, const StepExtras& extras = {});

  // The MTP layer (model.layers.{num_layers}; mtp.cpp) over a step's flat tokens: for flat token
  // t at position p (batch.positions[t]) with the target's hidden state h_in[t] at p (after the
  // final norm, as SGLang and vLLM feed it) and token tokens[t] = the token at p + 1:
  //   e = enorm(embed(token)), g = hnorm(h_in), x = eh_proj([e | g]), x = decoder block(x) with
  //   the MTP layer's own KV (pool layer num_layers), h_out = shared_head.norm(x),
  //   logits = head(h_out) (the MTP layer's own shared_head.head, else lm_head)
  // — the logits predict the token at p + 2. h_in [T, hidden]; h_out [T, hidden] or null;
  // logits rows as step(). The pool must have num_layers + 1 layers (mtp_kv_geometry).
  void mtp_step(const TensorView& tokens, const float* h_in, const KvBatchView& batch, HostKvPool& kv,
                const std::vector<int32_t>& logits_rows, const TensorView& logits, float* h_out);
  bool has_mtp() const { return !w_.mtp.empty(); }
  // A cache geometry with the MTP layer's KV as one more layer (index num_layers), and its index layers.
  PagedKvGeometry mtp_kv_geometry(int64_t page_size, int64_t num_pages, KvElem elem = KvElem::BF16) const;
  std::vector<bool> mtp_kv_index_layers() const;

 private:
  Model() = default;
  void check_step(const TensorView& tokens, const KvBatchView& b, const HostKvPool& kv,
                  const std::vector<int32_t>& logits_rows, const TensorView& logits, int64_t kv_layers);

  std::unique_ptr<Checkpoint> ck_;
  MlaModelConfig cfg_;
  ModelWeights w_;
  ModelOptions opt_;
  Arena arena_;
  std::string description_;
};

// Norms over rows of dim values (FP32), as transformers computes them:
//   RMSNorm:   y = w · x / sqrt(mean(x²) + eps)
//   LayerNorm: y = w · (x − mean) / sqrt(var + eps) + b   (biased variance)
void rms_norm_rows(const float* x, int64_t rows, int64_t dim, int64_t stride, const float* w, float eps, float* y,
                   int64_t y_stride);
void layer_norm_rows(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps, float* y);

}  // namespace fp4moe::model
