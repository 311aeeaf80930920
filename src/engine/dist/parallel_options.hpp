// --tp / --ep as the runner and the server take them. This version has no NCCL path: any
// value other than 1 is refused in one line, after the split itself has been checked against
// the model (so "--tp 3" on a 64-head model says why it could never work). --tp 1 --ep 1 is
// the single-GPU path itself, nothing else changes.
#pragma once

#include <string>

#include "engine/dist/shard_plan.hpp"

namespace fp4moe::dist {

inline constexpr const char* kMultiGpuNotBuilt =
    "multi-GPU (--tp/--ep > 1) needs NCCL and several GPUs: not built in this version";

// Validates the options against the model folder's config.json; throws unless tp = ep = 1.
void require_single_gpu(const std::string& model_dir, const ParallelConfig& par);

}  // namespace fp4moe::dist
