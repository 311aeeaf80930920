#include "engine/gpu/gpu_generate.hpp"

#include <span>

#include "core/error.hpp"
#include "engine/device_sampling.hpp"

namespace fp4moe::engine::gpu {

model::GenerateResult generate_gpu(GpuRunner& runner, const std::vector<int32_t>& prompt,
                                   const model::GenerateOptions& opt, std::vector<StepChoices>* choices) {
  const model::MlaModelConfig& c = runner.config();
  const int64_t P = int64_t(prompt.size()), N = opt.max_new_tokens, V = c.vocab;
  model::validate_prompt(c, prompt, opt);
  FP4MOE_CHECK(P + N <= runner.options().max_context,
               "the prompt ({} tokens) + {} new tokens exceed the runner's max context ({})", P, N,
               runner.options().max_context);
  FP4MOE_CHECK(P <= runner.options().max_tokens, "the prompt ({} tokens) exceeds the runner's --max-tokens {}", P,
               runner.options().max_tokens);
  const bool greedy = opt.sampling.greedy() && opt.sampling.logprobs_top_n < 0 &&
                      opt.sampling.repetition_penalty == 1.0f && opt.sampling.presence_penalty == 0.0f &&
                      opt.sampling.frequency_penalty == 0.0f;

  const int64_t ps = runner.page_size(), pages = (P + N + ps - 1) / ps;
  const std::vector<int32_t> table = runner.alloc_pages(pages);
  struct Release {
    GpuRunner& r;
    const std::vector<int32_t>& t;
    ~Release() { r.release_pages(t); }
  } release{runner, table};
  const int32_t page_ptr[2] = {0, int32_t(pages)};

  model::GenerateResult res;
  res.tokens = prompt;
  res.prompt_tokens = P;
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  std::vector<GeneratedToken> sampled;
  const cpu::SamplingParams& params = opt.sampling;
  auto run = [&](int64_t p0, int64_t n, model::HiddenStates* hidden) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
    const int32_t qo[2] = {0, int32_t(n)}, len[1] = {int32_t(p0 + n)};
    StepInput in;
    in.tokens = res.tokens.data() + p0;
    in.batch = {1, n, qo, pos.data(), len, page_ptr, table.data()};
    if (opt.keep_logits) {
      for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(int32_t(i));
    } else {
      in.logits_rows.push_back(int32_t(n - 1));
    }
    StepOutput out;
    out.logits = opt.keep_logits ? &logits : nullptr;
    out.greedy = &argmax;
    if (!greedy && p0 + n == int64_t(res.tokens.size())) {  // the step whose last row gives the next token
      RowSampling row;
      row.params = params;
      row.draw_index = int32_t(res.tokens.size()) - int32_t(P);
      row.prompt = prompt;
      row.generated = std::span<const int32_t>(res.tokens).subspan(size_t(P));
      in.sampling.push_back(row);
      out.sampled = &sampled;
    }
    out.hidden = hidden;
    if (choices) out.choices = &choices->emplace_back();
    runner.step(in, out);
    if (opt.keep_logits) res.logits.insert(res.logits.end(), logits.begin(), logits.end());
  };
  model::run_generation(res, V, opt, run, [&](uint64_t step) {
    cpu::SampledToken s;
    if (greedy) {
      s.token = argmax.back();
      return s;
    }
    FP4MOE_CHECK(sampled.size() == 1 && uint64_t(res.tokens.size()) - uint64_t(P) == step,
                 "generate: device sampling of draw {} missing", step);
    s.token = sampled[0].id;
    s.logprob = sampled[0].logprob;
    for (const TokenLogprob& t : sampled[0].top) s.top.emplace_back(t.id, t.logprob);
    sampled.clear();
    return s;
  });
  return res;
}

}  // namespace fp4moe::engine::gpu
