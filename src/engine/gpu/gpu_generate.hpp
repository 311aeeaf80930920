// Single-request generation on the GPU runner, the twin of model::generate (model/generate.hpp)
// with the same options and result: one prefill step over the prompt, then one decode step per
// new token (decode steps replay the batch-1 graph). Greedy tokens come from the device's
// argmax; other sampling (temperature, top-k/p, min-p, penalties, logprobs) runs on the device
// (StepInput::sampling, cuda/sampling's scheme: the same tokens as cpu::sample_cpu over
// the step's logits). --dump-logits still copies the
// logits rows back (keep_logits), before the sampler's in-place penalties.
#pragma once

#include <vector>

#include "engine/gpu/gpu_runner.hpp"
#include "model/generate.hpp"

namespace fp4moe::engine::gpu {

// Errors (one line): as model::validate_request, plus a request longer than the runner's
// max context or pool. choices (tests): each step's routing / top-k appended (steps run eager).
model::GenerateResult generate_gpu(GpuRunner& runner, const std::vector<int32_t>& prompt,
                                   const model::GenerateOptions& opt, std::vector<StepChoices>* choices = nullptr);

}  // namespace fp4moe::engine::gpu
