#include "engine/device_sampling.hpp"

#include <algorithm>
#include <climits>

#include "core/error.hpp"
#include "engine/sampling_cpu.hpp"

namespace fp4moe::engine {

cpu::SamplingRowParams row_params(const SamplingParams& p, int32_t top_logprobs) {
  return row_params(cpu_sampling(p, top_logprobs));  // greedy() -> temperature 0, top_k <= 0 -> 0
}

cpu::SamplingRowParams row_params(const cpu::SamplingParams& p) {
  cpu::SamplingRowParams r;
  r.temperature = p.temperature;
  r.top_k = int32_t(std::clamp<int64_t>(p.top_k, 0, INT32_MAX));
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.seed = p.seed;
  r.logprobs_top_n = p.logprobs_top_n < 0 ? -1 : p.logprobs_top_n;
  return r;
}

RowSampling row_sampling(const SampleSpec& s) {
  FP4MOE_CHECK(s.params, "sampling without parameters");
  RowSampling r;
  r.params = row_params(*s.params, s.top_logprobs);
  r.draw_index = s.output_index;
  r.prompt = s.prompt;
  r.generated = s.generated;
  return r;
}

bool has_penalties(const cpu::SamplingRowParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

bool plain_greedy(const cpu::SamplingRowParams& p) {
  return p.temperature == 0.0f && !has_penalties(p) && p.logprobs_top_n < 0;
}

int64_t history_stride(std::span<const RowSampling> rows, int64_t extra) {
  FP4MOE_CHECK(extra >= 0, "history stride: {} extra tokens", extra);
  int64_t s = 0;
  for (const RowSampling& r : rows)
    if (has_penalties(r.params)) s = std::max(s, int64_t(r.prompt.size() + r.generated.size()) + extra);
  return s;
}

void pack_sampling_rows(std::span<const RowSampling> rows, int64_t stride, int32_t* prompt_len, int32_t* output_len,
                        int32_t* draw, int32_t* history) {
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowSampling& x = rows[r];
    const bool pen = has_penalties(x.params);
    const int64_t n = int64_t(x.prompt.size() + x.generated.size());
    FP4MOE_CHECK(!pen || (history && n <= stride), "sampling row {}: {} penalty tokens, history stride {}", r, n, stride);
    FP4MOE_CHECK(x.draw_index >= 0, "sampling row {}: draw index {}", r, x.draw_index);
    prompt_len[r] = pen ? int32_t(x.prompt.size()) : 0;
    output_len[r] = int32_t(x.generated.size());
    draw[r] = x.draw_index;
    if (!pen) continue;
    int32_t* h = history + int64_t(r) * stride;
    h = std::copy(x.prompt.begin(), x.prompt.end(), h);
    std::copy(x.generated.begin(), x.generated.end(), h);
  }
}

int64_t pack_token_masks(std::span<const uint32_t* const> masks, int64_t words, int64_t max_packed, int32_t* slot,
                         uint32_t* packed) {
  FP4MOE_CHECK(words >= 1, "token masks of {} words", words);
  int64_t n = 0;
  for (size_t i = 0; i < masks.size(); ++i) {
    if (!masks[i]) {
      slot[i] = -1;
      continue;
    }
    FP4MOE_CHECK(n < max_packed, "token masks: more than {} constrained rows in one step", max_packed);
    std::copy_n(masks[i], words, packed + n * words);
    slot[i] = int32_t(n++);
  }
  return n;
}

}  // namespace fp4moe::engine
