#include "engine/memory_plan.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/units.hpp"

namespace fp4moe::engine {

MemoryPlan plan_memory(const BackendInfo& info, const MemoryPlanRequest& req) {
  FP4MOE_CHECK(req.page_size >= 1 && req.page_size <= 4096, "--page-size must be in [1, 4096] (got {})", req.page_size);
  FP4MOE_CHECK(req.max_total_tokens >= 0, "--max-total-tokens must be positive (got {})", req.max_total_tokens);
  FP4MOE_CHECK(req.mem_fraction_static >= 0.0 && req.mem_fraction_static < 1.0,
               "--mem-fraction-static must be in (0, 1) (got {})", req.mem_fraction_static);
  MemoryPlan plan;
  plan.page_size = req.page_size;
  plan.kv_bytes_per_token = std::max<int64_t>(1, info.kv_bytes_per_token);
  plan.weight_bytes = info.weight_bytes;
  plan.workspace_bytes = info.workspace_bytes;
  plan.device_bytes = info.device_bytes;
  int64_t tokens = req.max_total_tokens;
  const double fraction = req.mem_fraction_static > 0.0 ? req.mem_fraction_static : info.default_mem_fraction;
  if (info.kv_pool_tokens > 0) {  // planned by the backend from the same flags
    plan.mem_fraction_static = fraction;
    tokens = info.kv_pool_tokens;
  } else if (req.mem_fraction_static > 0.0 || (tokens == 0 && info.default_mem_fraction > 0.0)) {
    FP4MOE_CHECK(info.device_bytes > 0, "--mem-fraction-static: the {} backend does not know its memory size; give "
                 "--max-total-tokens", info.name);
    plan.mem_fraction_static = fraction;
    const int64_t budget = int64_t(std::floor(double(info.device_bytes) * plan.mem_fraction_static)) -
                           info.weight_bytes - info.workspace_bytes;
    FP4MOE_CHECK(budget >= plan.kv_bytes_per_token * req.page_size,
                 "no room for the KV cache: {} x {:.2f} = {} for weights {} + workspace {}", human_bytes(info.device_bytes),
                 plan.mem_fraction_static, human_bytes(int64_t(double(info.device_bytes) * plan.mem_fraction_static)),
                 human_bytes(info.weight_bytes), human_bytes(info.workspace_bytes));
    const int64_t fit = budget / plan.kv_bytes_per_token;
    tokens = tokens > 0 ? std::min(tokens, fit) : fit;
  }
  if (tokens == 0) tokens = req.default_tokens;
  const int64_t pages = tokens / req.page_size;
  FP4MOE_CHECK(pages >= 1, "the KV pool of {} tokens holds no page of {} tokens", tokens, req.page_size);
  FP4MOE_CHECK(pages <= INT32_MAX / 2, "the KV pool of {} pages is too large", pages);
  plan.num_pages = int32_t(pages);
  plan.kv_bytes = plan.tokens() * plan.kv_bytes_per_token;
  return plan;
}

std::string MemoryPlan::describe() const {
  std::string s = fmt::format("weights {}, workspace {}, KV pool {} pages x {} tokens = {} tokens ({} at {} per token)",
                              human_bytes(weight_bytes), human_bytes(workspace_bytes), num_pages, page_size, tokens(),
                              human_bytes(kv_bytes), human_bytes(kv_bytes_per_token));
  if (device_bytes > 0 && mem_fraction_static > 0.0)
    s += fmt::format(", device {} x {:.2f}", human_bytes(device_bytes), mem_fraction_static);
  return s;
}

}  // namespace fp4moe::engine
