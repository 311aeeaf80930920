#include "engine/gpu/gpu_generate.hpp"

#include <chrono>

#include "core/error.hpp"

namespace fp4moe::engine::gpu {

model::GenerateResult generate_gpu(GpuRunner& runner, const std::vector<int32_t>& prompt,
                                   const model::GenerateOptions& opt, std::vector<StepChoices>* choices) {
  const model::MlaModelConfig& c = runner.config();
  const int64_t P = int64_t(prompt.size()), N = opt.max_new_tokens, V = c.vocab;
  FP4MOE_CHECK(P >= 1, "the prompt is empty");
  FP4MOE_CHECK(N >= 1, "max_new_tokens {} must be >= 1", N);
  for (int64_t i = 0; i < P; ++i)
    FP4MOE_CHECK(prompt[size_t(i)] >= 0 && prompt[size_t(i)] < V, "prompt token {} = {} is out of the vocabulary (0 .. {})",
                 i, prompt[size_t(i)], V - 1);
  FP4MOE_CHECK(P + N <= c.max_position_embeddings && P + N <= runner.options().max_context,
               "the prompt ({} tokens) + {} new tokens exceed the max context ({} model, {} runner)", P, N,
               c.max_position_embeddings, runner.options().max_context);
  FP4MOE_CHECK(P <= runner.options().max_tokens, "the prompt ({} tokens) exceeds the runner's --max-tokens {}", P,
               runner.options().max_tokens);
  cpu::validate_sampling(opt.sampling);
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
  auto sample = [&](uint64_t step) {
    cpu::SampledToken s;
    if (greedy) {
      s.token = argmax.back();
    } else {
      const std::vector<int32_t> output(res.tokens.begin() + P, res.tokens.end());
      s = cpu::sample_cpu(logits.data() + logits.size() - size_t(V), V, opt.sampling, prompt, output, step);
    }
    res.tokens.push_back(step < opt.forced.size() ? opt.forced[step] : s.token);
    FP4MOE_CHECK(res.tokens.back() >= 0 && res.tokens.back() < V, "forced token {} is out of the vocabulary",
                 res.tokens.back());
    res.samples.push_back(std::move(s));
  };
  const auto t0 = std::chrono::steady_clock::now();
  run(0, P, opt.prompt_hidden);
  sample(0);
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 1; i < N; ++i) {
    run(P + i - 1, 1, nullptr);
    sample(uint64_t(i));
  }
  const auto t2 = std::chrono::steady_clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  res.new_tokens = N;
  return res;
}

}  // namespace fp4moe::engine::gpu
