#include "model/generate.hpp"

#include <chrono>

#include "core/error.hpp"

namespace fp4moe::model {

void validate_prompt(const MlaModelConfig& c, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  const int64_t P = int64_t(prompt.size()), N = opt.max_new_tokens, V = c.vocab;
  FP4MOE_CHECK(P >= 1, "the prompt is empty");
  FP4MOE_CHECK(N >= 1, "max_new_tokens {} must be >= 1", N);
  for (int64_t i = 0; i < P; ++i)
    FP4MOE_CHECK(prompt[size_t(i)] >= 0 && prompt[size_t(i)] < V, "prompt token {} = {} is out of the vocabulary (0 .. {})",
                 i, prompt[size_t(i)], V - 1);
  FP4MOE_CHECK(P + N <= c.max_position_embeddings,
               "the prompt ({} tokens) + {} new tokens exceed the model's max_position_embeddings ({})", P, N,
               c.max_position_embeddings);
  cpu::validate_sampling(opt.sampling);
}

void validate_request(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  validate_prompt(model.config(), prompt, opt);
  FP4MOE_CHECK(opt.page_size >= 1, "page size {} must be >= 1", opt.page_size);
}

void run_generation(GenerateResult& res, int64_t V, const GenerateOptions& opt,
                    const std::function<void(int64_t, int64_t, HiddenStates*)>& run,
                    const std::function<cpu::SampledToken(uint64_t)>& sample) {
  const int64_t P = res.prompt_tokens, N = opt.max_new_tokens;
  auto next = [&](uint64_t step) {
    cpu::SampledToken s = sample(step);
    res.tokens.push_back(step < opt.forced.size() ? opt.forced[step] : s.token);
    FP4MOE_CHECK(res.tokens.back() >= 0 && res.tokens.back() < V, "forced token {} is out of the vocabulary",
                 res.tokens.back());
    res.samples.push_back(std::move(s));
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.prefill_token_by_token) {
    for (int64_t p = 0; p < P; ++p) run(p, 1, nullptr);
  } else {
    run(0, P, opt.prompt_hidden);
  }
  next(0);
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 1; i < N; ++i) {
    run(P + i - 1, 1, nullptr);
    next(uint64_t(i));
  }
  const auto t2 = std::chrono::steady_clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  res.new_tokens = N;
}

GenerateResult generate(Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  validate_request(model, prompt, opt);
  if (opt.speculative_steps > 0) return generate_speculative(model, prompt, opt);
  const MlaModelConfig& c = model.config();
  const int64_t P = int64_t(prompt.size()), N = opt.max_new_tokens, V = c.vocab;

  const int64_t pages = (P + N + opt.page_size - 1) / opt.page_size;
  auto kv_owned = std::make_shared<HostKvPool>(model.kv_geometry(opt.page_size, pages, opt.kv_elem), model.kv_index_layers());
  HostKvPool& kv = *kv_owned;
  const std::vector<int32_t> page_table = kv.alloc(pages);
  const int32_t page_ptr[2] = {0, int32_t(pages)};

  GenerateResult res;
  if (opt.keep_kv) {
    res.kv = kv_owned;
    res.kv_pages = page_table;
  }
  res.tokens = prompt;
  res.prompt_tokens = P;
  if (opt.keep_logits) res.logits.reserve(size_t((P + N - 1) * V));
  std::vector<float> row(static_cast<size_t>(V));

  // Runs positions [p0, p0 + n) of the sequence; logits of its last token (all when keeping).
  auto run = [&](int64_t p0, int64_t n, HiddenStates* hidden) {
    std::vector<int32_t> pos(static_cast<size_t>(n)), want;
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
    const int32_t qo[2] = {0, int32_t(n)}, len[1] = {int32_t(p0 + n)};
    const KvBatchView b{1, n, qo, pos.data(), len, page_ptr, page_table.data()};
    if (opt.keep_logits) {
      for (int64_t i = 0; i < n; ++i) want.push_back(int32_t(i));
    } else {
      want.push_back(int32_t(n - 1));
    }
    std::vector<float> out(want.size() * size_t(V));
    model.step(TensorView::of(res.tokens.data() + p0, {n}), b, kv, want,
               TensorView::of(out.data(), {int64_t(want.size()), V}), hidden);
    if (opt.keep_logits) res.logits.insert(res.logits.end(), out.begin(), out.end());
    std::copy(out.end() - V, out.end(), row.begin());
  };
  run_generation(res, V, opt, run, [&](uint64_t step) {
    const std::vector<int32_t> output(res.tokens.begin() + P, res.tokens.end());
    return cpu::sample_cpu(row.data(), V, opt.sampling, prompt, output, step);
  });
  return res;
}

std::vector<float> mtp_prompt_logits(Model& model, const std::vector<int32_t>& prompt, int64_t page_size, KvElem kv_elem) {
  const MlaModelConfig& c = model.config();
  const int64_t P = int64_t(prompt.size()), V = c.vocab, H = c.hidden;
  FP4MOE_CHECK(model.has_mtp(), "--dump-mtp-logits: the checkpoint has no MTP layer (model.layers.{}.*; "
               "num_nextn_predict_layers {})", c.num_layers, c.num_nextn_predict_layers);
  FP4MOE_CHECK(P >= 2, "--dump-mtp-logits: the prompt has {} token(s); the MTP layer needs at least 2", P);
  FP4MOE_CHECK(page_size >= 1, "page size {} must be >= 1", page_size);
  const int64_t pages = (P + page_size - 1) / page_size;
  HostKvPool kv(model.mtp_kv_geometry(page_size, pages, kv_elem), model.mtp_kv_index_layers());
  const std::vector<int32_t> page_table = kv.alloc(pages);
  const int32_t page_ptr[2] = {0, int32_t(pages)};
  std::vector<int32_t> pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);
  std::vector<float> hidden(static_cast<size_t>(P * H));
  {
    const int32_t qo[2] = {0, int32_t(P)}, len[1] = {int32_t(P)};
    const KvBatchView b{1, P, qo, pos.data(), len, page_ptr, page_table.data()};
    StepExtras x;
    x.final_hidden = hidden.data();
    model.step(TensorView::of(const_cast<int32_t*>(prompt.data()), {P}), b, kv, {}, TensorView{}, nullptr, x);
  }
  const int64_t n = P - 1;
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end()), rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = int32_t(i);
  std::vector<float> logits(static_cast<size_t>(n * V));
  const int32_t qo[2] = {0, int32_t(n)}, len[1] = {int32_t(n)};
  const KvBatchView b{1, n, qo, pos.data(), len, page_ptr, page_table.data()};
  model.mtp_step(TensorView::of(next.data(), {n}), hidden.data(), b, kv, rows, TensorView::of(logits.data(), {n, V}),
                 nullptr);
  return logits;
}

}  // namespace fp4moe::model
