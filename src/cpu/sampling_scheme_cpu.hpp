// The host twin of the device sampler (cuda/sampling/sampling.hpp): one row by the scheme of
// cpu/sampling_scheme.hpp, written plainly (sorts, sequential sums), with the same arithmetic
// (IEEE division for the temperature, fixed-point masses, Philox bits, x − log(−log u)).
// It is the reference the GPU tests compare to token for token, and a CPU backend that wants
// the GPU's seeded tokens can call it. It also reports how close each decision came to its
// boundary, so that a test can tell a last-ulp expf / logf difference from a wrong token.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cpu/sampling_scheme.hpp"

namespace fp4moe::cpu {

struct SchemeToken {
  int32_t token = kNoToken;
  float logprob = 0.0f;                          // when logprobs_top_n >= 0, else 0
  std::vector<std::pair<int32_t, float>> top;    // [logprobs_top_n] best first
  int64_t kept = 0;                              // tokens the truncation kept (1 when greedy)
  // Near ties (last-ulp sensitive): the Gumbel key of the winner minus the runner-up's
  // (infinity with one kept token), and the relative distance of the top-p / min-p cuts from
  // their thresholds (infinity when off).
  double draw_margin = 0.0;
  double cut_margin = 0.0;
};

// The same knobs in cpu/sampling_cpu.hpp's form.
struct SamplingParams;
SamplingParams to_sampling_params(const SamplingRowParams& p);

// Checks the parameters (cpu::validate_sampling's ranges); throws with one line.
void validate_row_params(const SamplingRowParams& p);

// logits [vocab] (not modified); prompt / output: the request's token ids (penalties); step:
// the draw index (tokens generated so far).
SchemeToken sample_scheme_cpu(const float* logits, int64_t vocab, const SamplingRowParams& p,
                              const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, uint64_t step);

}  // namespace fp4moe::cpu
