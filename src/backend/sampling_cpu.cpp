#include "backend/sampling_cpu.hpp"

#include <vector>

#include "core/error.hpp"
#include "cpu/sampling_cpu.hpp"

namespace fp4moe::engine {

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
  cpu::SampledToken s = cpu::sample_cpu(logits, vocab, *spec.params, prompt, generated,
                                        uint64_t(spec.output_index));
  GeneratedToken out;
  out.id = s.token;
  out.logprob = s.logprob;
  for (const auto& [id, lp] : s.top) out.top.push_back({id, lp});
  return out;
}

}  // namespace fp4moe::engine
