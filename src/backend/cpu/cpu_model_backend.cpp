#include "backend/cpu/cpu_model_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <new>

#include <fmt/format.h>

#include "core/error.hpp"
#include "backend/sampling_cpu.hpp"
#include "backend/speculative_round.hpp"

namespace fp4moe::engine {
namespace {


}  // namespace

CpuModelBackend::CpuModelBackend(const CpuModelBackendOptions& options) : opt_(options) {
  model::ModelOptions mo;
  mo.threads = opt_.threads;
  mo.quantize_mtp_experts = opt_.quantize_draft_experts && opt_.speculative_steps > 0;
  mo.on_moe_routing = [this](int64_t layer, std::span<const int32_t> per_expert) {
    if (observer_) observer_->on_moe_gemm(int32_t(layer), per_expert);
  };
  model_ = model::Model::load(opt_.model_dir, mo);
  FP4MOE_CHECK(opt_.speculative_steps == 0 || model_->has_mtp(),
               "--speculative-algorithm NEXTN: {} has no MTP layer (model.layers.{}.*; num_nextn_predict_layers {})",
               opt_.model_dir, model_->config().num_layers, model_->config().num_nextn_predict_layers);
  FP4MOE_CHECK(!opt_.mtp_layer || model_->has_mtp(),
               "--dump-mtp-logits: the checkpoint has no MTP layer (model.layers.{}.*; num_nextn_predict_layers {})",
               model_->config().num_layers, model_->config().num_nextn_predict_layers);
  opt_.mtp_layer = opt_.mtp_layer || opt_.speculative_steps > 0;
  std::error_code ec;  // the shards the model mmap'd (regular files; anything else was refused or is unused)
  for (const auto& e : std::filesystem::directory_iterator(opt_.model_dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) weight_bytes_ += int64_t(e.file_size(ec));
}

BackendInfo CpuModelBackend::info() const {
  const auto& c = model_->config();
  BackendInfo i;
  i.name = "cpu";
  i.applies_token_masks = true;  // sample_row_cpu
  i.dumps_rows = uint8_t(kDumpLogits | kDumpHidden | (opt_.mtp_layer ? kDumpMtpLogits : 0));
  i.overlaps_token_masks = true;  // step() waits for them after the forward
  i.speculates_constrained = opt_.speculative_steps > 0;  // the round masks its rows (MtpSpeculator)
  i.vocab_size = int32_t(c.vocab);
  i.max_context = int32_t(std::min<int64_t>(c.max_position_embeddings, INT32_MAX));
  const bool mtp = opt_.mtp_layer;  // the MTP layer's KV is counted with the rest
  const PagedKvGeometry g = mtp ? model_->mtp_kv_geometry(1, 1, opt_.kv_elem) : model_->kv_geometry(1, 1, opt_.kv_elem);
  const auto index_layers = mtp ? model_->mtp_kv_index_layers() : model_->kv_index_layers();
  int64_t per_token = 0;
  for (int64_t l = 0; l < g.num_layers; ++l)
    per_token += int64_t(g.ckv_bytes() + g.kpe_bytes() + (index_layers[size_t(l)] ? g.index_bytes() : 0));
  i.kv_bytes_per_token = per_token;
  i.weight_bytes = weight_bytes_;  // mmap'd: counted against the host's memory
  i.device_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  return i;
}

void CpuModelBackend::init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) {
  if (opt_.mtp_layer) {
    kv_ = std::make_unique<model::HostKvPool>(model_->mtp_kv_geometry(page_size, num_pages, opt_.kv_elem),
                                              model_->mtp_kv_index_layers());
    spec_ = std::make_unique<model::MtpSpeculator>(*model_, *kv_, std::max(opt_.speculative_steps, 1),
                                                    opt_.catchup_over_verify_rows);
    spec_->draft_override = opt_.draft_override;
    spec_->defer_rows = max_step_tokens;
  } else {
    kv_ = std::make_unique<model::HostKvPool>(model_->kv_geometry(page_size, num_pages, opt_.kv_elem),
                                              model_->kv_index_layers());
  }
  kv_len_.reserve(size_t(max_requests));
  logits_.reserve(size_t(max_requests) * size_t(model_->config().vocab));
}

void CpuModelBackend::step(const StepBatch& batch, std::vector<GeneratedToken>& out) {
  FP4MOE_CHECK(kv_, "cpu backend: step before init_kv");
  const int32_t n = batch.num_requests();
  const KvBatchView view = batch.kv_view(kv_len_, rows_);
  const int64_t vocab = model_->config().vocab;
  auto dump = [&](int32_t r) { return batch.dump.empty() ? uint8_t(0) : batch.dump[size_t(r)]; };
  uint8_t any_dump = 0;
  for (int32_t r = 0; r < n; ++r) any_dump |= dump(r);
  FP4MOE_CHECK(!any_dump || batch.dumps, "cpu backend: a step with dumps and nowhere to put them");
  // The logits rows: each sampling request's last token, or every token of one dumping its logits.
  rows_.clear();
  sample_at_.assign(size_t(n), -1);
  for (int32_t r = 0; r < n; ++r) {
    const int32_t b = batch.token_begin[size_t(r)], e = batch.token_begin[size_t(r) + 1];
    if (dump(r) & kDumpLogits)
      for (int32_t t = b; t < e - 1; ++t) rows_.push_back(t);
    if ((dump(r) & kDumpLogits) || batch.sample[size_t(r)]) {
      rows_.push_back(e - 1);
      if (batch.sample[size_t(r)]) sample_at_[size_t(r)] = int32_t(rows_.size()) - 1;
    }
  }
  logits_.resize(rows_.size() * size_t(vocab));
  // The host model keeps no state across a failed step (its scratch arena resets per step, the
  // batch's KV pages are freed with its requests): an error or a failed allocation fails this
  // batch's requests only (StepError), and the engine goes on serving.
  const size_t first = out.size();
  try {
    model::StepExtras x;
    if (spec_) {
      hidden_.resize(size_t(batch.num_tokens()) * size_t(model_->config().hidden));
      x.final_hidden = hidden_.data();
    }
    model_->step(TensorView::of(batch.tokens.data(), {batch.num_tokens()}), view, *kv_, rows_,
                 TensorView::of(logits_.data(), {int64_t(rows_.size()), vocab}),
                 (any_dump & kDumpHidden) ? &step_hidden_ : nullptr, x);
    if (batch.await_token_masks) batch.await_token_masks();  // filled during the forward
    for (int32_t r = 0; r < n; ++r)
      if (batch.sample[size_t(r)])
        out.push_back(sample_row_cpu(logits_.data() + size_t(sample_at_[size_t(r)]) * size_t(vocab), vocab,
                                     batch.sampling[size_t(r)]));
    if (any_dump) dump_rows(batch);
    if (spec_) {  // the MTP layer over the pairs this step completed (the next round's first draft)
      const int64_t H = model_->config().hidden;
      size_t s = first;
      for (int32_t r = 0; r < n; ++r) {
        const int32_t next = batch.sample[size_t(r)] ? out[s++].id : -1;
        spec_->add_target_rows(batch.request_ids[size_t(r)], batch.start(r), batch.request_tokens(r),
                               hidden_.data() + int64_t(batch.token_begin[size_t(r)]) * H, next, batch.page_table(r),
                               (dump(r) & kDumpMtpLogits) != 0);
      }
      spec_->settle_queued();  // decode-round pairs may wait for the next round (speculative.hpp)
      for (int32_t r = 0; r < n; ++r) {
        if (!(dump(r) & kDumpMtpLogits)) continue;
        RowDump d;
        d.request = r;
        d.what = kDumpMtpLogits;
        d.width = int32_t(vocab);
        d.data = spec_->take_logits(batch.request_ids[size_t(r)], &d.start);
        d.rows = int32_t(d.data.size() / size_t(vocab));
        if (d.rows > 0) batch.dumps->push_back(std::move(d));
      }
    }
  } catch (const Error& e) {
    out.resize(first);
    throw StepError(e.what());
  } catch (const std::bad_alloc&) {
    out.resize(first);
    throw StepError(fmt::format("out of memory in a step of {} tokens", batch.num_tokens()));
  }
}

void CpuModelBackend::dump_rows(const StepBatch& batch) {
  const int64_t vocab = model_->config().vocab, H = model_->config().hidden;
  for (int32_t r = 0; r < batch.num_requests(); ++r) {
    const uint8_t bits = batch.dump.empty() ? 0 : batch.dump[size_t(r)];
    const int32_t b = batch.token_begin[size_t(r)], n = batch.count(r);
    if (bits & kDumpLogits) {  // its rows are consecutive in rows_, ending at its last token
      int32_t k = 0;
      while (rows_[size_t(k)] != b) ++k;
      RowDump& d = batch.add_dump(r, kDumpLogits, vocab);
      std::copy(logits_.begin() + int64_t(k) * vocab, logits_.begin() + int64_t(k + n) * vocab, d.data.begin());
    }
    if (bits & kDumpHidden) batch.add_hidden_dumps(r, H, step_hidden_);
  }
}

void CpuModelBackend::decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out) {
  if (!spec_ || opt_.speculative_steps == 0) return Backend::decode(batch, limits, steps, out);
  FP4MOE_CHECK(kv_, "cpu backend: decode before init_kv");
  const int32_t n = batch.num_requests();
  std::vector<model::SpecRoundResult> res;
  try {
    const SpecRoundInput in = spec_round_input(batch, limits, steps);
    res = spec_->round(in.requests);
  } catch (const Error& e) {
    throw StepError(e.what());
  } catch (const std::bad_alloc&) {
    throw StepError(fmt::format("out of memory in a speculative round of {} requests", n));
  }
  spec_round_output(res, out, observer_);
}

}  // namespace fp4moe::engine
