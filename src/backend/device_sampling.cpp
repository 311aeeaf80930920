#include "backend/device_sampling.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4moe::engine {

RowSampling row_sampling(const SampleSpec& s) {
  FP4MOE_CHECK(s.params, "sampling without parameters");
  RowSampling r;
  r.params = *s.params;
  r.draw_index = s.output_index;
  r.prompt = s.prompt;
  r.generated = s.generated;
  return r;
}

bool plain_greedy(const cpu::SamplingParams& p) { return p.greedy() && !p.has_penalties() && p.logprobs_top_n < 0; }

int64_t history_stride(std::span<const RowSampling> rows, int64_t extra) {
  FP4MOE_CHECK(extra >= 0, "history stride: {} extra tokens", extra);
  int64_t s = 0;
  for (const RowSampling& r : rows)
    if (r.params.has_penalties()) s = std::max(s, int64_t(r.prompt.size() + r.generated.size()) + extra);
  return s;
}

void pack_sampling_rows(std::span<const RowSampling> rows, int64_t stride, int32_t* prompt_len, int32_t* output_len,
                        int32_t* draw, int32_t* history) {
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowSampling& x = rows[r];
    const bool pen = x.params.has_penalties();
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
