// The engine's sampling requests in the device sampler's form (cuda/sampling, the scheme of
// core/sampling_scheme.hpp): per-row SamplingParams, the draw index, and the penalty token
// lists packed at one fixed stride. Plain host code (built without CUDA too, unit-tested in CI);
// the GPU runner (backend/cuda) uploads what it produces.
#pragma once

#include <cstdint>
#include <span>

#include "core/sampling_params.hpp"
#include "engine/backend.hpp"

namespace fp4moe::engine {

// One row the device samples: its parameters, the draw index (tokens generated so far: with
// params.seed it fixes the draw), and its token lists (read only when the params have a penalty).
struct RowSampling {
  cpu::SamplingParams params;
  int32_t draw_index = 0;
  std::span<const int32_t> prompt;     // the request's prompt (repetition penalty)
  std::span<const int32_t> generated;  // its output so far (all penalties)
};

// A SampleSpec as a device row (draw index = its output index; the spans point into the spec's).
RowSampling row_sampling(const SampleSpec& s);

// Greedy, no penalties, no logprobs: the device's argmax of the row is the whole answer.
bool plain_greedy(const cpu::SamplingParams& p);

// The history stride of a batch: the longest prompt + generated (+ extra: tokens a K-step launch
// appends) over the rows with penalties; 0 when no row has one (no history uploaded).
int64_t history_stride(std::span<const RowSampling> rows, int64_t extra);

// Row r's ints for the device: prompt_len[r], output_len[r] (its generated count) and draw[r];
// a row with penalties gets its prompt then its generated tokens at history + r * stride (rows
// without penalties: prompt_len 0, their history left as is). stride: history_stride(rows, >= 0).
void pack_sampling_rows(std::span<const RowSampling> rows, int64_t stride, int32_t* prompt_len, int32_t* output_len,
                        int32_t* draw, int32_t* history);

// Constrained decoding (cuda/sampling/token_bitmask_f32): masks[i] is logits row i's vocabulary
// bitmask (SampleSpec::allowed_tokens, `words` words) or null. slot[i] = -1 for a row without
// one, else the index of its copy in `packed` (the masked rows in order, `words` apart). Returns
// how many were packed; more than max_packed is refused (one line).
int64_t pack_token_masks(std::span<const uint32_t* const> masks, int64_t words, int64_t max_packed, int32_t* slot,
                         uint32_t* packed);

}  // namespace fp4moe::engine
