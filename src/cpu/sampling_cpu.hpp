// Sampling of one next token from a row of logits on the CPU: the CPU backend's sampler and the
// reference of the device sampler (cuda/sampling), token for token. The scheme — penalties,
// greedy, temperature, top-k / top-p / min-p, the Philox-seeded Gumbel-max draw, logprobs — is
// core/sampling_scheme.hpp's; this is its plain host form (sorts only where a truncation needs
// the rank order, sequential sums of the same fixed-point weights).
//
// When do the CPU and the GPU give the same token? Both compute the same keys from the same
// bits, so they differ only through (a) the logits themselves and (b) the last ulp of
// logf / expf (each within 1 ulp of the exact value, so the two within 2 ulp). Let the two
// backends' scaled logits x = logit / T differ by at most d per token (d = max |Δlogit| / T;
// 0 when they are the same floats). Then
//   - the draw: e = −logf(u) differs by a relative 2 · 2^-23; log(e) (|log e| <= 16.7) by that
//     plus 2 ulp of 16.7, <= 4.1e-6; the key x − log(e) by that, d, and one rounding of the
//     result (ulp of |x| + 17): ε_g = d + 4.1e-6 + 1.2e-7 · (|x| + 17). Both the winner's and
//     the runner-up's keys move, so the winner is the same when draw_margin (its key minus
//     the runner-up's) > 2 ε_g.
//   - the cuts: a weight exp(x − max) moves by a relative 2d (x and max each by d) plus 2 ulp
//     of expf; top-p's kept count is the same when cut_margin (the distance of the cumulative
//     mass from the target, relative to the total) exceeds twice that: 4d + 2.4e-7; min-p's
//     when no x lies within 2d + 2 ulp of max + log(min_p) (cut_margin: that distance relative
//     to max(1, |cut|), held to the same 4d + 2.4e-7).
//   - comparisons of x alone (greedy's winner against the runner-up, top-k's last kept token
//     against the first dropped: rank_margin, their gap) use no logf / expf: with the same
//     floats (d = 0) they are decided the same on every backend, ties included (lower id);
//     else they hold when rank_margin > 2d.
// sample_cpu reports draw_margin and cut_margin; the GPU tests (tests/backend/gpu_sampling_test,
// tests/cuda/sampling_test) and the emulator test (tests/ops/sampling_emu_test) assert equality
// exactly where these hold, and count the rest.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/sampling_params.hpp"

namespace fp4moe::cpu {

// stable_draw(t, d): the token t is the same on every backend whose scaled logits are within
// d of these, by the bounds above (|x| of the winner and the runner-up: t.draw_x_abs).
struct SampledToken;
bool stable_draw(const SampledToken& t, double d);

struct SampledToken {
  int32_t token = kNoToken;
  float logprob = 0.0f;                           // when logprobs_top_n >= 0
  std::vector<std::pair<int32_t, float>> top;     // [top_n] (token, logprob), best first
  int64_t kept = 0;                               // tokens the truncation kept (1 when greedy)
  // How close the decisions came (infinity when there was nothing to decide): the winner's
  // Gumbel key minus the runner-up's, the relative distance of the top-p / min-p cuts from
  // their thresholds, and the gap of the comparisons of x alone (greedy's top two, top-k's
  // boundary).
  double draw_margin = std::numeric_limits<double>::infinity();
  double cut_margin = std::numeric_limits<double>::infinity();
  double rank_margin = std::numeric_limits<double>::infinity();
  double draw_x_abs = 0.0;  // max |x| of the winner and the runner-up (their keys' rounding)
};

// logits [vocab] (not modified); prompt / output: the request's token ids so far (for the
// penalties); step: the draw index (tokens generated so far: 0 for its first new token).
// Validates p (validate_sampling) and 1 <= vocab < 2^23; throws with one line.
SampledToken sample_cpu(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, uint64_t step);

// Speculative decoding's rejection sampling (model/speculative.cpp) needs what sample_cpu draws from:
// the distribution of a sampled (not greedy) draw after steps 1, 3 and 4: [vocab] probabilities
// exp(x − max), renormalised over the kept tokens (the same kept set as sample_cpu), 0 elsewhere;
// a NaN logit has no mass and +inf logits, when there are any, share all of it (the draw's rules).
std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& p,
                                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& output);
// sampling_distribution's values over the tokens it can give mass: ids ascending, prob[i] the
// probability of ids[i] (the same double, bit for bit); a token not listed has probability +0.0.
// With top-k / top-p / min-p the listing is the kept set (a few hundred tokens, not the
// vocabulary); without truncation, every token. Summing prob in order gives the dense vector's sum.
struct SparseDistribution {
  int64_t vocab = 0;
  std::vector<int32_t> ids;
  std::vector<double> prob;
  double at(int32_t token) const;  // 0 when not listed
};
SparseDistribution sampling_distribution_sparse(const float* logits, int64_t vocab, const SamplingParams& p,
                                                const std::vector<int32_t>& prompt, const std::vector<int32_t>& output);
// sample_cpu's logprob fields (when p.logprobs_top_n >= 0) for a token chosen elsewhere.
SampledToken logprobs_of(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output, int32_t token);
// A uniform double in [0, 1) of the same Philox stream for (seed, step) (uniform_53), for
// draws that are not per token.
double sampling_uniform(uint64_t seed, uint64_t step);
// Constrained decoding: logits[v] = -inf for every token v whose bit in allowed (bit v % 32 of
// word v / 32) is clear (the reference of the CUDA mask kernel). Returns how many stay.
int64_t apply_token_bitmask(float* logits, int64_t vocab, const uint32_t* allowed);

}  // namespace fp4moe::cpu
