#include "engine/sampling_cpu.hpp"

#include <vector>

#include "core/error.hpp"

namespace fp4moe::engine {

cpu::SamplingParams cpu_sampling(const SamplingParams& p, int32_t top_logprobs) {
  cpu::SamplingParams c;
  c.temperature = p.greedy() ? 0.0f : p.temperature;
  c.top_k = p.top_k > 0 ? p.top_k : 0;
  c.top_p = p.top_p;
  c.min_p = p.min_p;
  c.repetition_penalty = p.repetition_penalty;
  c.presence_penalty = p.presence_penalty;
  c.frequency_penalty = p.frequency_penalty;
  c.seed = p.seed;
  c.logprobs_top_n = top_logprobs;
  return c;
}

GeneratedToken sample_row_cpu(const float* logits, int64_t vocab, const SampleSpec& spec) {
  FP4MOE_CHECK(spec.params, "sampling without parameters");
  const std::vector<int32_t> prompt(spec.prompt.begin(), spec.prompt.end());
  const std::vector<int32_t> generated(spec.generated.begin(), spec.generated.end());
  if (spec.allowed_tokens) {  // constrained: the disallowed logits to -inf on a copy
    thread_local std::vector<float> masked;
    masked.assign(logits, logits + vocab);
    FP4MOE_CHECK(cpu::apply_token_bitmask(masked.data(), vocab, spec.allowed_tokens) > 0,
                 "the grammar allows no token (the scheduler finishes such a request before sampling)");
    logits = masked.data();
  }
  cpu::SampledToken s = cpu::sample_cpu(logits, vocab, cpu_sampling(*spec.params, spec.top_logprobs), prompt, generated,
                                        uint64_t(spec.output_index));
  GeneratedToken out;
  out.id = s.token;
  out.logprob = s.logprob;
  for (const auto& [id, lp] : s.top) out.top.push_back({id, lp});
  return out;
}

}  // namespace fp4moe::engine
