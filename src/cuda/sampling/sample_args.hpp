// The arguments of cuda::sampling::sample() (sampling.hpp), in plain C++ (no CUDA types): the
// launch code and the kernels' header (sample_f32_kernels.cuh, which the CUDA emulator of
// tests/cuda/emu also compiles) share them.
#pragma once

#include <cstdint>

#include "core/sampling_scheme.hpp"

namespace fp4moe::cuda::sampling {

using cpu::kMaxTopLogprobs;
using cpu::kNoToken;
using cpu::SamplingParams;

struct SampleArgs {
  float* logits = nullptr;                     // [rows, logits_stride] F32 (penalised rows: modified in place)
  int64_t logits_stride = 0;                   // >= vocab (elements)
  int32_t rows = 0;                            // host
  int32_t vocab = 0;                           // host, >= 1
  const SamplingParams* params = nullptr;   // [rows] device
  const int32_t* draw_index = nullptr;         // [rows] the request's draw counter (tokens generated so far); null: 0
  const int32_t* done = nullptr;               // [rows] nonzero: the row is finished, writes kNoToken; null: none
  // Penalty token lists (required when any row has a penalty: with history null the kernel
  // cannot fail, it skips penalties, so the runner must pass them): row r's prompt
  // is history[r * history_stride, + prompt_len[r]), its output the next output_len[r] ids.
  const int32_t* history = nullptr;            // [rows, history_stride]
  int64_t history_stride = 0;
  const int32_t* prompt_len = nullptr;         // [rows]
  const int32_t* output_len = nullptr;         // [rows] (DecodeState::generated)
  // Outputs.
  int32_t* tokens = nullptr;                   // [rows] the sampled token (kNoToken for done rows)
  float* logprob = nullptr;                    // [rows] its logprob (rows with logprobs_top_n >= 0); may be null
  int32_t* top_ids = nullptr;                  // [rows, kMaxTopLogprobs] best first, kNoToken padded; may be null
  float* top_logprobs = nullptr;               // [rows, kMaxTopLogprobs]; with top_ids
};

}  // namespace fp4moe::cuda::sampling
