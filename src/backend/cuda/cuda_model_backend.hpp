// The GPU backend of the engine (and so of `fp4moe serve --backend cuda`): the GpuRunner's
// forward step over the engine's flat batch. The runner plans its own memory at load
// (weights, one workspace for the largest step, then the paged KV pool from
// --mem-fraction-static / --max-total-tokens) and the engine's page ids address its pool
// directly. Sampling: a step whose sampling requests are all plain greedy (no logprobs, no
// penalties) reads back only the device's argmax per row; any other step samples every row on
// the device (cuda/sampling: backend/device_sampling.hpp's rows) and reads back only tokens and
// logprobs. Seeded draws are the one scheme of core/sampling_scheme.hpp (Philox Gumbel-max), as
// on the CPU backend: a seed gives the CPU backend's tokens wherever the logits allow
// (cpu::stable_draw).
// K decode steps per round: one GpuRunner::decode_greedy (all plain greedy) or decode_sampled
// call (K graph replays back to back with sampling, the next token, positions and stop checks on
// the device; the host reads the tokens once). A round beyond what the runner was sized for
// (RunnerOptions::max_decode_steps, max_stop_ids; engine/decode_capacity.hpp) is refused with a
// StepError naming its requests, never run on a host loop instead; `serve` sizes the runner from
// --num-continuous-decode-steps and the API's stop-id limit, so its rounds always fit.
// /metrics' tokens per expert come from the runner's per-layer device counts. Dumps
// (RequestSpec::dump, `fp4moe generate --dump-logits / --dump-hidden`): the logits of every token
// of the request (the runner must allow that many logits rows) and the eager step's hidden states.
// Speculative decoding (speculative_steps N >= 1, `--speculative-algorithm NEXTN`): the runner
// loads the MTP layer and allows (N + 1)x the requests per step (the verify step's rows; the
// decode graphs' cap, RunnerOptions::cuda_graph_max_bs, is scaled alike); a
// decode call is one draft/verify round of model::MtpSpeculator over the runner's steps
// (gpu_spec_steps.hpp: the draft steps and the verify step — a decode step of R·(N+1) rows —
// graph-replayed within the buckets, the MTP catch-up eager), the draws and acceptance on the host; every
// step() feeds the MTP layer the pairs it completed. Constrained requests are refused in a round
// (StepError), as in a K-step decode.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/cuda/gpu_spec_steps.hpp"
#include "model/speculative.hpp"

namespace fp4moe::engine::gpu {

struct CudaModelBackendOptions {
  std::string model_dir;
  RunnerOptions runner;  // max_tokens / max_requests bound every step the engine may send
  int32_t speculative_steps = 0;        // --speculative-num-steps with --speculative-algorithm NEXTN; 0: off
  // Load and run the MTP layer (implied by speculative_steps > 0; `generate --dump-mtp-logits`
  // without speculation): every step feeds it its pairs; RowDump kDumpMtpLogits on request.
  bool mtp_layer = false;
  model::DraftOverride draft_override;  // tests (model/speculative.hpp)
};

class CudaModelBackend : public Backend {
 public:
  explicit CudaModelBackend(const CudaModelBackendOptions& options);
  ~CudaModelBackend() override;
  BackendInfo info() const override;
  void init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) override;
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override;
  void decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out) override;
  // A finished, aborted or retracted request's speculative state (its MTP position, draft logits /
  // token and hidden state) goes with it, as on the CPU backend.
  void release_requests(std::span<const uint64_t> request_ids) override {
    if (spec_) spec_->release(request_ids);
  }
  const GpuRunner& runner() const { return *runner_; }
  // Speculative decoding's steps and speculator (null when off).
  const GpuSpecSteps* spec_steps() const { return spec_steps_.get(); }
  model::MtpSpeculator* speculator() { return spec_.get(); }
  GpuRunner& runner() { return *runner_; }

 private:
  CudaModelBackendOptions opt_;
  std::unique_ptr<GpuRunner> runner_;
  std::unique_ptr<GpuSpecSteps> spec_steps_;
  std::unique_ptr<model::MtpSpeculator> spec_;
  std::vector<float> final_hidden_;  // speculative: the step's rows after the final norm
  void speculative_decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out);
  int64_t device_bytes_ = 0;
  bool kv_ready_ = false;
  // Per-step host buffers (reused).
  std::vector<int32_t> kv_len_, greedy_, counts_, tokens_, produced_;
  std::vector<RowSampling> rows_;         // the step's sampling rows (device form)
  std::vector<GeneratedToken> sampled_;   // device-sampled tokens
  std::vector<int32_t> moe_layers_;  // layer ids of the runner's count rows
  // Dumps (RequestSpec::dump): the step's logits rows and hidden states; the dumped rows that are
  // not sampled lead the step's logits rows (dump_rows_ of them).
  std::vector<float> logits_;
  model::HiddenStates hidden_;
  int32_t dump_rows_ = 0;
  void dump_rows(const StepBatch& batch, const StepInput& in);

  StepInput view(const StepBatch& batch);       // kv_len_ filled; logits rows: each sampling request's last token
  void report_counts(size_t steps);              // counts_ [steps x moe layers x experts] to the observer
};

}  // namespace fp4moe::engine::gpu
