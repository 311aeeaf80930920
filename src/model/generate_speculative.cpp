// generate_speculative: the single-request loop of generate() with MTP draft/verify rounds.
#include <chrono>

#include "core/error.hpp"
#include "model/generate.hpp"
#include "model/speculative.hpp"

namespace fp4moe::model {

GenerateResult generate_speculative(Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  validate_request(model, prompt, opt);
  FP4MOE_CHECK(!opt.keep_logits, "--dump-logits with speculative decoding: the verify steps' rows are not one per token; "
                                 "dump without --speculative-algorithm");
  FP4MOE_CHECK(opt.forced.empty() && !opt.prefill_token_by_token && opt.prompt_hidden == nullptr,
               "speculative decoding: teacher forcing, a token-by-token prompt and prompt hidden states are not offered");
  const MlaModelConfig& c = model.config();
  const int64_t P = int64_t(prompt.size()), N = opt.max_new_tokens, V = c.vocab, H = c.hidden;
  const int64_t pages = (P + N + opt.page_size - 1) / opt.page_size;
  auto kv_owned = std::make_shared<HostKvPool>(model.mtp_kv_geometry(opt.page_size, pages, opt.kv_elem),
                                               model.mtp_kv_index_layers());
  HostKvPool& kv = *kv_owned;
  const std::vector<int32_t> page_table = kv.alloc(pages);
  MtpSpeculator spec(model, kv, opt.speculative_steps);
  spec.draft_override = opt.draft_override;

  GenerateResult res;
  res.tokens = prompt;
  res.prompt_tokens = P;
  res.accept_length.assign(size_t(opt.speculative_steps) + 1, 0);
  if (opt.keep_kv) {
    res.kv = kv_owned;
    res.kv_pages = page_table;
  }
  const auto t0 = std::chrono::steady_clock::now();
  {  // The prefill: the target over the prompt, its first token, the MTP layer over the prompt's pairs.
    std::vector<int32_t> pos(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);
    const int32_t qo[2] = {0, int32_t(P)}, len[1] = {int32_t(P)}, page_ptr[2] = {0, int32_t(pages)};
    const KvBatchView b{1, P, qo, pos.data(), len, page_ptr, page_table.data()};
    std::vector<float> hidden(static_cast<size_t>(P * H)), row(static_cast<size_t>(V));
    StepExtras x;
    x.final_hidden = hidden.data();
    model.step(TensorView::of(res.tokens.data(), {P}), b, kv, {int32_t(P - 1)}, TensorView::of(row.data(), {1, V}), nullptr, x);
    cpu::SampledToken s = cpu::sample_cpu(row.data(), V, opt.sampling, prompt, {}, 0);
    res.tokens.push_back(s.token);
    res.samples.push_back(std::move(s));
    spec.add_target_rows(0, 0, prompt, hidden.data(), res.tokens.back(), page_table);
    spec.run_queued();
  }
  const auto t1 = std::chrono::steady_clock::now();
  const MtpSpeculator::Times before = spec.times;
  while (int64_t(res.samples.size()) < N) {
    const int64_t done = int64_t(res.samples.size());
    SpecRequest rq;
    rq.id = 0;
    rq.start = int32_t(P + done - 1);
    rq.last_token = res.tokens.back();
    rq.pages = page_table;
    rq.max_new = int32_t(N - done);
    rq.sampling = opt.sampling;
    rq.prompt = prompt;
    rq.generated.assign(res.tokens.begin() + P, res.tokens.end());
    rq.output_index = uint64_t(done);
    SpecRoundResult r = std::move(spec.round({rq})[0]);
    ++res.verify_steps;
    res.drafted += r.drafted;
    res.accepted += r.accepted;
    ++res.accept_length[r.tokens.size() - 1];
    for (auto& t : r.tokens) {
      res.tokens.push_back(t.token);
      res.samples.push_back(std::move(t));
    }
  }
  const auto t2 = std::chrono::steady_clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  res.new_tokens = N;
  res.draft_seconds = spec.times.draft - before.draft;
  res.verify_seconds = spec.times.verify - before.verify;
  res.mtp_seconds = spec.times.mtp - before.mtp;
  return res;
}

}  // namespace fp4moe::model
