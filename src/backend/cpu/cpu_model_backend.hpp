// The CPU backend: model::Model's forward step over the engine's flat batch and paged KV
// (model::HostKvPool's arrays, addressed by the engine's page ids), sampled on the host.
// K-step decode is Backend's host loop; with speculative decoding (speculative_steps N >= 1) a
// decode call is one MTP draft/verify round (model/speculative.hpp) that emits 1 .. N + 1
// tokens per request, and every step also runs the MTP layer over the positions it computed.
// The MTP layer's KV is one more layer of the host pool, addressed by the same page ids.
// Dumps (RequestSpec::dump, `fp4moe generate --dump-*`): the logits of every token of a request,
// the hidden states of its step, and (with the MTP layer) the MTP logits of its pairs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"
#include "engine/backend.hpp"
#include "model/kv_pool.hpp"
#include "model/model.hpp"
#include "model/speculative.hpp"

namespace fp4moe::engine {

struct CpuModelBackendOptions {
  std::string model_dir;
  int threads = 0;                 // 0: default_num_threads()
  KvElem kv_elem = KvElem::BF16;   // --kv-cache-dtype
  int32_t speculative_steps = 0;   // --speculative-num-steps with --speculative-algorithm NEXTN; 0: off
  // The pool holds the MTP layer and every step runs it over the pairs it completed (implied by
  // speculative_steps > 0; `generate --dump-mtp-logits` without speculation).
  bool mtp_layer = false;
  // With speculation: the MTP layer's BF16 routed experts (NVIDIA's NVFP4 checkpoints) quantized
  // to NVFP4 at load for the drafts (the commands' `--speculative-draft-model-quantization nvfp4`,
  // their default), or kept BF16 (false: unquant). The output does not depend on it
  // (verification uses the target).
  bool quantize_draft_experts = false;
  model::DraftOverride draft_override;  // tests (model/speculative.hpp)
  // Tests: the round's MTP catch-up over every verify row, the cuda backend's form
  // (SpecSteps::catchup_over_verify_rows), instead of over the emitted pairs.
  bool catchup_over_verify_rows = false;
};

class CpuModelBackend : public Backend {
 public:
  explicit CpuModelBackend(const CpuModelBackendOptions& options);
  BackendInfo info() const override;
  void init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) override;
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override;
  void decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out) override;
  void release_requests(std::span<const uint64_t> request_ids) override {
    if (spec_) spec_->release(request_ids);
  }
  // Tests: the pool (its layer num_layers is the MTP layer's when speculating).
  const model::HostKvPool& kv_pool() const { return *kv_; }
  const model::Model& model() const { return *model_; }
  // Speculative decoding's wall seconds so far (draft steps, verify steps, MTP steps); zeros without it.
  model::MtpSpeculator::Times speculator_times() const { return spec_ ? spec_->times : model::MtpSpeculator::Times{}; }
  const model::MtpSpeculator* speculator() const { return spec_.get(); }  // null without speculation

 private:
  CpuModelBackendOptions opt_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::HostKvPool> kv_;
  std::unique_ptr<model::MtpSpeculator> spec_;
  std::vector<float> hidden_;  // speculative: the step's rows after the final norm
  int64_t weight_bytes_ = 0;
  void dump_rows(const StepBatch& batch);  // the step's logits / hidden rows of the requests that dump them
  std::vector<int32_t> kv_len_, rows_, sample_at_;  // sample_at_[r]: request r's sampled row in rows_
  model::HiddenStates step_hidden_;  // a step with a kDumpHidden request
  std::vector<float> logits_;
};

}  // namespace fp4moe::engine
