#include "engine/gpu/gpu_generate.hpp"

#include "core/error.hpp"

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
  const bool greedy = opt.sampling.temperature == 0.0f && opt.sampling.logprobs_top_n < 0 &&
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
    out.logits = (opt.keep_logits || !greedy) ? &logits : nullptr;
    out.greedy = &argmax;
    out.hidden = hidden;
    if (choices) out.choices = &choices->emplace_back();
    runner.step(in, out);
    if (opt.keep_logits) res.logits.insert(res.logits.end(), logits.begin(), logits.end());
  };
  model::run_generation(res, V, opt, run, [&](uint64_t step) {
    if (greedy) {
      cpu::SampledToken s;
      s.token = argmax.back();
      return s;
    }
    const std::vector<int32_t> output(res.tokens.begin() + P, res.tokens.end());
    return cpu::sample_cpu(logits.data() + logits.size() - size_t(V), V, opt.sampling, prompt, output, step);
  });
  return res;
}

}  // namespace fp4moe::engine::gpu
