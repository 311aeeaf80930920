#include <gtest/gtest.h>

#include "core/error.hpp"
#include "engine/memory_plan.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;

namespace {

BackendInfo gpu_like() {
  BackendInfo i;
  i.name = "gpu-like";
  i.kv_bytes_per_token = 1000;
  i.weight_bytes = 500'000;
  i.workspace_bytes = 100'000;
  i.device_bytes = 1'000'000;
  i.default_mem_fraction = 0.88;
  return i;
}

}  // namespace

TEST(MemoryPlan, KvPoolFromWhatTheDeviceFractionLeaves) {
  MemoryPlanRequest r;
  r.page_size = 16;
  const MemoryPlan p = plan_memory(gpu_like(), r);  // 0.88 x 1e6 - 6e5 = 280000 B = 280 tokens = 17 pages
  EXPECT_EQ(p.num_pages, 17);
  EXPECT_EQ(p.tokens(), 272);
  EXPECT_EQ(p.kv_bytes, 272'000);
  r.mem_fraction_static = 0.7;  // 100000 B: 100 tokens, 6 pages
  EXPECT_EQ(plan_memory(gpu_like(), r).num_pages, 6);
  r.max_total_tokens = 32;  // caps the fraction
  EXPECT_EQ(plan_memory(gpu_like(), r).num_pages, 2);
  EXPECT_NE(plan_memory(gpu_like(), r).describe().find("KV pool 2 pages x 16 tokens"), std::string::npos);
}

TEST(MemoryPlan, HostBackendsTakeATokenCountNotTheMachine) {
  BackendInfo host = gpu_like();
  host.default_mem_fraction = 0.0;
  MemoryPlanRequest r;
  r.page_size = 4;
  r.default_tokens = 4096;
  EXPECT_EQ(plan_memory(host, r).num_pages, 1024);
  r.max_total_tokens = 10;
  EXPECT_EQ(plan_memory(host, r).num_pages, 2);
}

TEST(MemoryPlan, ImpossiblePlansAreOneLineErrors) {
  MemoryPlanRequest r;
  r.mem_fraction_static = 0.5;  // 500000 < weights + workspace
  EXPECT_THROW(plan_memory(gpu_like(), r), Error);
  BackendInfo unknown = gpu_like();
  unknown.device_bytes = 0;
  EXPECT_THROW(plan_memory(unknown, r), Error);
  MemoryPlanRequest tiny;
  tiny.page_size = 16;
  tiny.max_total_tokens = 8;  // less than a page
  EXPECT_THROW(plan_memory(gpu_like(), tiny), Error);
}

TEST(MemoryPlan, ABackendThatPlannedItsPoolIsTakenAsIs) {
  BackendInfo planned = gpu_like();
  planned.kv_pool_tokens = 4096;  // the GPU runner sized its pool at load from the same flags
  MemoryPlanRequest r;
  r.page_size = 16;
  r.mem_fraction_static = 0.7;
  const MemoryPlan p = plan_memory(planned, r);
  EXPECT_EQ(p.num_pages, 256);
  EXPECT_DOUBLE_EQ(p.mem_fraction_static, 0.7);
  EXPECT_NE(p.describe().find("device"), std::string::npos);
}

TEST(MemoryPlan, AHostPlanDoesNotPrintADeviceFraction) {
  BackendInfo host = gpu_like();
  host.default_mem_fraction = 0.0;
  MemoryPlanRequest r;
  r.page_size = 4;
  r.max_total_tokens = 64;
  EXPECT_EQ(plan_memory(host, r).describe().find("device"), std::string::npos);
}
