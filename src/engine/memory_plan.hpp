// The start-up memory plan: weights, then the workspaces of the largest step, then the KV pool
// from what is left (--mem-fraction-static of the device) or from --max-total-tokens. A backend that
// plans its own pool (the CUDA runner: backend/runner_memory_plan.hpp) reports it in
// BackendInfo::kv_pool_tokens and this plan takes it as is.
#pragma once

#include <cstdint>
#include <string>

#include "core/paged_kv.hpp"

#include "engine/backend.hpp"

namespace fp4moe::engine {

struct MemoryPlanRequest {
  int32_t page_size = 16;
  int64_t max_total_tokens = 0;      // > 0: the pool holds this many tokens (at most)
  double mem_fraction_static = 0.0;  // > 0: weights + workspace + KV take this fraction of the device
  int64_t default_tokens = 65536;    // when neither applies and the backend has no default fraction
};

struct MemoryPlan {
  int32_t page_size = 0;
  int32_t num_pages = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes = 0;
  int64_t weight_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t device_bytes = 0;
  double mem_fraction_static = 0.0;
  int64_t tokens() const { return int64_t(num_pages) * page_size; }
  std::string describe() const;  // one line
};

MemoryPlan plan_memory(const BackendInfo& info, const MemoryPlanRequest& req);

}  // namespace fp4moe::engine
