// Shared by the GPU runner's tests (tests/engine/gpu_*_test.cpp): the tiny GLM-5 goldens'
// checkpoints (tests/model/golden) as BF16, NVIDIA's NVFP4 layout (routed experts only) and
// all-NVFP4 (`fp4moe quantize`, made once per process), small runner options, prompts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "engine/gpu/gpu_runner.hpp"
#include "model/model_test_util.hpp"

namespace fp4moe::testing_gpu_runner {

namespace fs = std::filesystem;
using testing_model::golden_dir;

struct Case {
  std::string name, variant;  // golden folder; "bf16" | "nvfp4" | "nvfp4_all"
};

inline std::string model_dir(const Case& c) {
  if (c.variant == "bf16") return golden_dir(c.name) + "/model";
  static std::map<std::string, std::string> made;
  static testing_cli::TempDir tmp("gpu_runner_models");
  const std::string key = c.name + "_" + c.variant;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const fs::path out = tmp.path / key;
  const std::string extra = c.variant == "nvfp4" ? " --only '*.mlp.experts.*' --input-amax 8" : "";
  const auto r = testing_cli::run_binary(tmp.path, "quantize " + golden_dir(c.name) + "/model " + out.string() + extra);
  EXPECT_EQ(r.rc, 0) << r.err;
  return made[key] = out.string();
}

inline engine::gpu::RunnerOptions small_options() {
  engine::gpu::RunnerOptions o;
  o.max_tokens = 128;
  o.max_requests = 8;
  o.max_context = 256;
  o.page_size = 16;
  o.max_total_tokens = 4096;
  o.cuda_graph_max_bs = 8;
  o.quiet = true;
  o.poison = true;
  return o;
}

inline std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(2 + (i * 37 + seed * 101 + 7) % (vocab - 2)));
  return p;
}

}  // namespace fp4moe::testing_gpu_runner
