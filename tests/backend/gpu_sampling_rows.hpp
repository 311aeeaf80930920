// Shared by the GPU runner's sampling tests (gpu_sampling_test, gpu_token_mask_test): a batch
// whose rows mix every sampling mode, with the requests' prompts (as prefill() made them) and
// generated tokens, handed to the runner as RowSampling rows.
#pragma once

#include <cstdint>
#include <vector>

#include "core/sampling_params.hpp"
#include "backend/device_sampling.hpp"
#include "backend/gpu_runner_test_util.hpp"

namespace fp4moe::testing_gpu_runner {

// Row r's parameters: r % 4 = plain greedy; temperature + top-p + logprobs 5; top-k + min-p +
// all three penalties + logprobs 0; greedy + repetition penalty + logprobs 3. Seed seed_base +
// 7919 r (each test its own base, so that two tests do not draw the same numbers).
inline cpu::SamplingParams mixed_sampling(int r, uint64_t seed_base) {
  cpu::SamplingParams p;
  p.temperature = 0.0f;  // greedy unless the mix says otherwise
  switch (r % 4) {
    case 0:
      break;
    case 1:
      p.temperature = 0.7f, p.top_p = 0.9f, p.logprobs_top_n = 5;
      break;
    case 2:
      p.temperature = 1.0f, p.top_k = 20, p.min_p = 0.05f, p.repetition_penalty = 1.3f, p.presence_penalty = 0.5f,
      p.frequency_penalty = 0.3f, p.logprobs_top_n = 0;
      break;
    default:
      p.repetition_penalty = 1.5f, p.logprobs_top_n = 3;
  }
  p.seed = seed_base + uint64_t(r) * 7919;
  return p;
}

// Requests of the given prompt lengths (prompt_of(len, vocab, r + 5), as prefill() made them),
// row r sampled by mixed_sampling(r, seed_base); nothing generated yet.
struct SampledRequests {
  std::vector<cpu::SamplingParams> params;
  std::vector<std::vector<int32_t>> prompt, gen;
  SampledRequests(const std::vector<int64_t>& lens, int64_t vocab, uint64_t seed_base) {
    for (size_t r = 0; r < lens.size(); ++r) {
      params.push_back(mixed_sampling(int(r), seed_base));
      prompt.push_back(prompt_of(lens[r], vocab, int(r) + 5));
      gen.emplace_back();
    }
  }
  std::vector<engine::RowSampling> rows() const {
    std::vector<engine::RowSampling> out;
    for (size_t r = 0; r < params.size(); ++r) {
      engine::RowSampling x;
      x.params = params[r];
      x.draw_index = int32_t(gen[r].size());
      x.prompt = prompt[r];
      x.generated = gen[r];
      out.push_back(x);
    }
    return out;
  }
};

}  // namespace fp4moe::testing_gpu_runner
