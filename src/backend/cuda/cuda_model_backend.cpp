#include "backend/cuda/cuda_model_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "engine/decode_capacity.hpp"
#include "backend/device_sampling.hpp"
#include "backend/speculative_round.hpp"

namespace fp4moe::engine::gpu {

CudaModelBackend::CudaModelBackend(const CudaModelBackendOptions& options) : opt_(options) {
  RunnerOptions ro = opt_.runner;
  const int32_t N = opt_.speculative_steps;
  FP4MOE_CHECK(N >= 0 && N <= 16, "--speculative-num-steps {} must be in [1, 16]", N);
  opt_.mtp_layer = opt_.mtp_layer || N > 0;
  ro.mtp = opt_.mtp_layer;
  if (N > 0) {  // a verify step of R·(N + 1) one-token rows (gpu_spec_steps.hpp)
    ro.max_requests = ro.max_requests * (N + 1);
    ro.max_tokens = std::max(ro.max_tokens, ro.max_requests);
    if (ro.min_tokens > 0) ro.min_tokens = std::max(ro.min_tokens, ro.max_requests);
    if (ro.cuda_graph_max_bs > 0) ro.cuda_graph_max_bs *= N + 1;  // graphs for the verify steps of that many requests
  }
  runner_ = GpuRunner::load(opt_.model_dir, ro);
  if (opt_.mtp_layer) {
    spec_steps_ = std::make_unique<GpuSpecSteps>(*runner_);
    spec_ = std::make_unique<model::MtpSpeculator>(*spec_steps_, std::max(N, 1));
    spec_->draft_override = opt_.draft_override;
  }
  size_t free_b = 0, total_b = 0;
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  device_bytes_ = int64_t(total_b);
  moe_layers_ = runner_->moe_layer_ids();
}

CudaModelBackend::~CudaModelBackend() = default;

BackendInfo CudaModelBackend::info() const {
  const auto& c = runner_->config();
  BackendInfo i;
  i.name = "cuda";
  i.vocab_size = int32_t(c.vocab);
  i.max_context = int32_t(std::min<int64_t>({c.max_position_embeddings, runner_->options().max_context, INT32_MAX}));
  i.kv_bytes_per_token = runner_->kv_bytes_per_token();
  i.weight_bytes = runner_->weight_bytes();
  i.workspace_bytes = runner_->workspace_bytes();
  i.device_bytes = device_bytes_;
  i.default_mem_fraction = runner_->options().mem_fraction_static;
  i.kv_pool_tokens = runner_->num_pages() * runner_->page_size();
  i.applies_token_masks = true;  // step(): StepInput::token_masks, applied before the argmax and sample()
  // step(): every row's logits, the eager step's hidden states; the MTP layer's logits with it
  i.dumps_rows = uint8_t(kDumpLogits | kDumpHidden | (opt_.mtp_layer ? kDumpMtpLogits : 0));
  i.overlaps_token_masks = true;  // step(): the runner waits for them after enqueueing the forward (gpu_step.cpp)
  // Speculative rounds mask their draft and verify rows by each constrained request's grammar on
  // the host (model::MtpSpeculator; the verify step's logits come back before the acceptance).
  i.speculates_constrained = opt_.speculative_steps > 0;
  return i;
}

void CudaModelBackend::init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) {
  FP4MOE_CHECK(page_size == runner_->page_size(), "cuda backend: page size {} but the runner was planned for {}",
               page_size, runner_->page_size());
  FP4MOE_CHECK(num_pages >= 1 && num_pages <= runner_->num_pages(),
               "cuda backend: {} KV pages asked for, the runner's pool holds {}", num_pages, runner_->num_pages());
  FP4MOE_CHECK(max_step_tokens <= runner_->options().max_tokens && max_requests <= runner_->options().max_requests,
               "cuda backend: steps of up to {} tokens / {} requests, the runner was sized for {} / {}",
               max_step_tokens, max_requests, runner_->options().max_tokens, runner_->options().max_requests);
  kv_len_.reserve(size_t(max_requests));
  if (spec_) spec_->defer_rows = max_step_tokens;
  kv_ready_ = true;
}

StepInput CudaModelBackend::view(const StepBatch& batch) {
  StepInput in;
  in.tokens = batch.tokens.data();
  in.batch = batch.kv_view(kv_len_, in.logits_rows);
  if (std::none_of(batch.dump.begin(), batch.dump.end(), [](uint8_t d) { return (d & kDumpLogits) != 0; })) return in;
  // A request dumping its logits: every token's row. The rows that are not sampled come first
  // (the device samples the last StepInput::sampling.size() rows), then one per sampling request.
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < batch.num_requests(); ++r) {
    if (!(batch.dump[size_t(r)] & kDumpLogits)) continue;
    const int32_t b = batch.token_begin[size_t(r)], e = batch.token_begin[size_t(r) + 1];
    for (int32_t t = b; t < e - (batch.sample[size_t(r)] ? 1 : 0); ++t) rows.push_back(t);
  }
  dump_rows_ = int32_t(rows.size());
  rows.insert(rows.end(), in.logits_rows.begin(), in.logits_rows.end());
  in.logits_rows = std::move(rows);
  return in;
}

void CudaModelBackend::dump_rows(const StepBatch& batch, const StepInput& in) {
  const int64_t V = runner_->config().vocab, H = runner_->config().hidden;
  auto row_of = [&](int32_t t) {  // the index of token t's logits row
    return int64_t(std::find(in.logits_rows.begin(), in.logits_rows.end(), t) - in.logits_rows.begin());
  };
  for (int32_t r = 0; r < batch.num_requests(); ++r) {
    const uint8_t bits = batch.dump.empty() ? 0 : batch.dump[size_t(r)];
    const int32_t b = batch.token_begin[size_t(r)], n = batch.count(r);
    if (bits & kDumpLogits) {
      RowDump& d = batch.add_dump(r, kDumpLogits, V);  // a failed step's dumps are never read
      for (int32_t i = 0; i < n; ++i) {
        const int64_t k = row_of(b + i);
        FP4MOE_CHECK(k < int64_t(in.logits_rows.size()), "cuda backend: no logits row for token {}", b + i);
        std::copy(logits_.begin() + k * V, logits_.begin() + (k + 1) * V, d.data.begin() + int64_t(i) * V);
      }
    }
    if (bits & kDumpHidden) batch.add_hidden_dumps(r, H, hidden_);
  }
}

void CudaModelBackend::report_counts(size_t steps) {
  if (!observer_ || moe_layers_.empty()) return;
  const size_t E = size_t(runner_->num_experts()), L = moe_layers_.size();
  FP4MOE_CHECK(counts_.size() == steps * L * E, "cuda backend: {} expert counts for {} steps x {} layers x {}",
               counts_.size(), steps, L, E);
  for (size_t j = 0; j < steps; ++j)
    for (size_t l = 0; l < L; ++l)
      observer_->on_moe_gemm(moe_layers_[l], {counts_.data() + (j * L + l) * E, E});
}

void CudaModelBackend::step(const StepBatch& batch, std::vector<GeneratedToken>& out) {
  FP4MOE_CHECK(kv_ready_, "cuda backend: step before init_kv");
  const int32_t n = batch.num_requests();
  dump_rows_ = 0;
  StepInput in = view(batch);
  uint8_t any_dump = 0;
  for (uint8_t d : batch.dump) any_dump |= d;
  FP4MOE_CHECK(!any_dump || batch.dumps, "cuda backend: a step with dumps and nowhere to put them");
  // Plain greedy rows only: the device's argmax is the whole answer; otherwise every sampling
  // row goes through the device sampler (greedy rows give the argmax there too).
  // Grammar masks: one per logits row (the sampling rows, in order), null where unconstrained.
  bool greedy = true, masked = false;
  rows_.clear();
  in.token_masks.assign(size_t(dump_rows_), nullptr);  // the dumped rows that are not sampled: unmasked
  for (int32_t r = 0; r < n; ++r)
    if (batch.sample[size_t(r)]) {
      rows_.push_back(row_sampling(batch.sampling[size_t(r)]));
      greedy = greedy && plain_greedy(rows_.back().params);
      in.token_masks.push_back(batch.sampling[size_t(r)].allowed_tokens);
      masked = masked || in.token_masks.back();
    }
  if (!masked) in.token_masks.clear();
  if (masked) in.await_token_masks = batch.await_token_masks;  // filled while the forward runs
  StepOutput so;
  so.greedy = greedy ? &greedy_ : nullptr;
  if (!greedy) {
    in.sampling = rows_;
    so.sampled = &sampled_;
  }
  const bool counts = observer_ && runner_->options().count_experts && !moe_layers_.empty();
  so.expert_counts = counts ? &counts_ : nullptr;
  so.logits = (any_dump & kDumpLogits) ? &logits_ : nullptr;
  so.hidden = (any_dump & kDumpHidden) ? &hidden_ : nullptr;
  so.final_hidden = spec_ ? &final_hidden_ : nullptr;
  runner_->step(in, so);
  if (counts) report_counts(1);
  if (any_dump) dump_rows(batch, in);
  const size_t first = out.size();
  for (size_t k = 0; k < rows_.size(); ++k) {
    if (greedy) {
      GeneratedToken t;
      t.id = greedy_[size_t(dump_rows_) + k];
      out.push_back(std::move(t));
    } else {
      out.push_back(std::move(sampled_[k]));
    }
  }
  if (!spec_) return;
  // The MTP layer over the pairs this step completed (the next round's first draft), as the CPU
  // backend does. An error here fails the step's requests (their MTP state is dropped with them).
  try {
    const int64_t H = runner_->config().hidden;
    size_t s = first;
    for (int32_t r = 0; r < n; ++r) {
      const int32_t next = batch.sample[size_t(r)] ? out[s++].id : -1;
      spec_->add_target_rows(batch.request_ids[size_t(r)], batch.start(r), batch.request_tokens(r),
                             final_hidden_.data() + int64_t(batch.token_begin[size_t(r)]) * H, next,
                             batch.page_table(r), (batch.dump.empty() ? 0 : batch.dump[size_t(r)]) & kDumpMtpLogits);
    }
    spec_->settle_queued();  // decode-round pairs may wait for the next round (speculative.hpp)
    for (int32_t r = 0; r < n && !batch.dump.empty(); ++r) {  // the MTP logits of the pairs this step completed
      if (!(batch.dump[size_t(r)] & kDumpMtpLogits)) continue;
      RowDump d;
      d.request = r;
      d.what = kDumpMtpLogits;
      d.width = int32_t(runner_->config().vocab);
      d.data = spec_->take_logits(batch.request_ids[size_t(r)], &d.start);
      d.rows = int32_t(d.data.size() / size_t(d.width));
      if (d.rows > 0) batch.dumps->push_back(std::move(d));
    }
  } catch (const Error& e) {
    out.resize(first);
    for (int32_t r = 0; r < n; ++r) spec_->forget(batch.request_ids[size_t(r)]);
    throw StepError(e.what());
  }
}

void CudaModelBackend::speculative_decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps,
                                          DecodeOutput& out) {
  std::vector<model::SpecRoundResult> res;
  try {
    const SpecRoundInput in = spec_round_input(batch, limits, steps);
    res = spec_->round(in.requests);
  } catch (const Error& e) {
    for (int32_t r = 0; r < batch.num_requests(); ++r) spec_->forget(batch.request_ids[size_t(r)]);
    throw StepError(e.what());
  }
  spec_round_output(res, out, observer_);
}

void CudaModelBackend::decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out) {
  FP4MOE_CHECK(kv_ready_, "cuda backend: decode before init_kv");
  if (spec_ && opt_.speculative_steps > 0) return speculative_decode(batch, limits, steps, out);
  const int32_t n = batch.num_requests();
  const RunnerOptions& ro = runner_->options();
  // Every round runs on the device: one the runner was not sized for is refused (the requests
  // named get the reason), never sent to Backend's host loop over step() in silence.
  if (const auto no = decode_capacity_refusal(batch, limits, steps, {ro.max_decode_steps, ro.max_stop_ids}))
    throw StepError("cuda backend: " + no->reason, no->request_ids);
  // A token mask depends on the token sampled just before: the scheduler runs batches with a
  // constrained request one step() per round; one reaching here would go unconstrained.
  for (int32_t r = 0; r < n; ++r)
    if (batch.sampling[size_t(r)].allowed_tokens)
      throw StepError("cuda backend: a K-step decode cannot apply grammar masks (constrained requests run one step "
                      "per round)",
                      {batch.request_ids[size_t(r)]});
  rows_.clear();
  bool greedy = true;
  for (int32_t r = 0; r < n; ++r) {
    rows_.push_back(row_sampling(batch.sampling[size_t(r)]));
    greedy = greedy && plain_greedy(rows_.back().params);
  }
  DecodeInput in;
  const StepInput first = view(batch);
  in.tokens = first.tokens;
  in.batch = first.batch;
  in.steps = steps;
  in.max_new = limits.max_new.data();
  in.stop_ids = limits.stop_ids;
  const bool counts = observer_ && ro.count_experts && !moe_layers_.empty();
  if (greedy) {
    runner_->decode_greedy(in, tokens_, produced_, counts ? &counts_ : nullptr);
  } else {
    in.sampling = rows_;  // K steps of device sampling (draw index = output index, +1 per token)
    runner_->decode_sampled(in, tokens_, produced_, &sampled_, counts ? &counts_ : nullptr);
  }
  out.tokens.assign(size_t(n), {});
  for (int32_t r = 0; r < n; ++r)
    for (int32_t j = 0; j < produced_[size_t(r)]; ++j) {
      const size_t i = size_t(j) * size_t(n) + size_t(r);
      GeneratedToken t;
      if (!greedy) t = std::move(sampled_[i]);
      t.id = tokens_[i];
      out.tokens[size_t(r)].push_back(std::move(t));
    }
  // The scheduler counts a step only while some request still produces: steps past the last
  // request's last token ran on dummies (their counts are zero) and are not reported either.
  int32_t live_steps = 0;
  for (int32_t p : produced_) live_steps = std::max(live_steps, p);
  if (counts) {
    counts_.resize(size_t(live_steps) * moe_layers_.size() * size_t(runner_->num_experts()));
    report_counts(size_t(live_steps));
  }
}

}  // namespace fp4moe::engine::gpu
