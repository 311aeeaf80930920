// Sampling of one next token from a row of logits: the CPU op (and the reference for a GPU
// sampler).
//
// Order of operations on the FP32 logits of one request:
//   1. penalties (the vLLM / OpenAI definitions):
//        repetition_penalty p (p != 1): every token seen in the prompt OR the output so far:
//          logit > 0 ? logit / p : logit · p
//        presence_penalty:  logit −= presence  for every token in the output so far
//        frequency_penalty: logit −= frequency · (count of the token in the output so far)
//   2. temperature == 0: greedy — the highest logit, ties to the lower token id. Done.
//   3. logit /= temperature; probabilities = softmax over the vocabulary (FP64 sums).
//   4. truncation, in this order, over tokens ranked by probability (ties: lower id first):
//        top_k > 0: keep the top_k first;  top_p < 1: keep the shortest prefix whose
//        probability mass (of what top-k kept, renormalised) reaches top_p;
//        min_p > 0: keep tokens with probability >= min_p · (the highest probability).
//      At least one token always stays.
//   5. draw u in [0, 1) from the request's stream: u = splitmix64(seed, step) with 53 bits,
//      and walk the kept tokens in rank order until the renormalised cumulative mass > u.
//      The same (logits, params, seed, step) always gives the same token, on any thread count.
// Logprobs (when asked): log-softmax of the logits after steps 1 and 3 (temperature 1 when
// greedy), before truncation: of the chosen token, and the top_n tokens (ties: lower id).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace fp4moe::cpu {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int logprobs_top_n = -1;   // -1: no logprobs; 0: the chosen token's only; n: and the top n
};

// Checks the ranges (temperature >= 0, top_p in (0, 1], min_p in [0, 1], repetition > 0,
// top_k >= 0, top_n <= 20); throws fp4moe::Error with one line.
void validate_sampling(const SamplingParams& p);

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                           // when logprobs_top_n >= 0
  std::vector<std::pair<int32_t, float>> top;     // [top_n] (token, logprob), best first
};

// logits [vocab] (not modified); prompt / output: the request's token ids so far (for the
// penalties); step: the index of this draw in the request (0 for its first new token).
SampledToken sample_cpu(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, uint64_t step);

// Speculative decoding's rejection sampling (model/speculative.cpp) needs what sample_cpu draws from:
// The distribution of a sampled (temperature > 0) draw after steps 1, 3 and 4: [vocab]
// probabilities, renormalised over the kept tokens, 0 elsewhere.
std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& p,
                                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& output);
// sample_cpu's logprob fields (when p.logprobs_top_n >= 0) for a token chosen elsewhere.
SampledToken logprobs_of(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output, int32_t token);
// Step 5's uniform draw in [0, 1) for (seed, step): 53 bits of splitmix64.
double sampling_uniform(uint64_t seed, uint64_t step);
// Constrained decoding: logits[v] = -inf for every token v whose bit in allowed (bit v % 32 of
// word v / 32) is clear (the reference of the CUDA mask kernel). Returns how many stay.
int64_t apply_token_bitmask(float* logits, int64_t vocab, const uint32_t* allowed);

}  // namespace fp4moe::cpu
