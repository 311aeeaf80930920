// Shared by the GPU runner's tests (tests/engine/gpu_*_test.cpp): the tiny GLM-5 goldens'
// checkpoints (tests/model/golden) as BF16, NVIDIA's NVFP4 layout (routed experts only) and
// all-NVFP4 (`fp4moe quantize`, made once per process), small runner options, prompts,
// requests prefilled for decode steps, the bit-for-bit logits check.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "engine/gpu/gpu_generate.hpp"
#include "engine/gpu/gpu_runner.hpp"
#include "model/generate.hpp"
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

// Requests whose prompts (but their last token) are in the cache, ready for decode steps: the
// page table of each covers `room` positions past its last token (pages of gpu.page_size()).
struct Decoding {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> tok, pos, qo{0}, len, pp{0}, pi;
  KvBatchView batch() const {
    const int64_t B = int64_t(tok.size());
    return {B, B, qo.data(), pos.data(), len.data(), pp.data(), pi.data()};
  }
  void release(engine::gpu::GpuRunner& g) {
    for (const auto& t : tables) g.release_pages(t);
  }
};

inline Decoding prefill(engine::gpu::GpuRunner& gpu, const std::vector<int64_t>& lens, int64_t room) {
  Decoding d;
  const int64_t V = gpu.config().vocab, page = gpu.page_size();
  for (size_t r = 0; r < lens.size(); ++r) {
    const int64_t n = lens[r];
    d.tables.push_back(gpu.alloc_pages((n - 1 + room + page - 1) / page));
    const std::vector<int32_t> p = prompt_of(n, V, int(r) + 5);
    std::vector<int32_t> ps(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ps[size_t(i)] = int32_t(i);
    const int32_t q1[2] = {0, int32_t(n - 1)}, l1[1] = {int32_t(n - 1)}, ptr[2] = {0, int32_t(d.tables.back().size())};
    engine::gpu::StepInput pre;
    pre.tokens = p.data();
    pre.batch = {1, n - 1, q1, ps.data(), l1, ptr, d.tables.back().data()};
    if (n > 1) gpu.step(pre, {});
    d.tok.push_back(p.back());
    d.pos.push_back(int32_t(n - 1));
    d.len.push_back(int32_t(n));
    d.qo.push_back(int32_t(r + 1));
    d.pi.insert(d.pi.end(), d.tables.back().begin(), d.tables.back().end());
    d.pp.push_back(int32_t(d.pi.size()));
  }
  return d;
}

// Two runs' logits, bit for bit (graph replay vs eager), every value finite.
inline void expect_bitwise_equal(const std::vector<float>& eager, const std::vector<float>& graph, int64_t V,
                                 const std::string& what) {
  ASSERT_EQ(eager.size(), graph.size()) << what;
  for (size_t i = 0; i < eager.size(); ++i) {
    ASSERT_TRUE(std::isfinite(eager[i])) << what << " logit " << i;
    ASSERT_EQ(std::memcmp(&eager[i], &graph[i], 4), 0) << what << " row " << i / size_t(V) << " col " << i % size_t(V)
                                                       << ": " << eager[i] << " vs " << graph[i];
  }
}

// Requests of the given lengths prefilled in ONE step (mixed), then `steps` decode steps together
// (graphs where the runner has them): each request's logits (rel L2 <= 1e-2) and greedy tokens
// (where the alone run's top-2 margin > 1e-2) = the request run alone (generate_gpu); both
// follow the alone run's tokens. Prompts: prompt_of(len, vocab, seed + i). Returns how many of
// the batched steps replayed a graph.
inline int64_t expect_batch_equals_alone(engine::gpu::GpuRunner& gpu, const std::vector<int64_t>& lens, int64_t steps,
                                      int seed) {
  const int64_t V = gpu.config().vocab, page = gpu.page_size();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lens.size(); ++i) prompts.push_back(prompt_of(lens[i], V, int(i) + seed));
  std::vector<model::GenerateResult> alone;
  model::GenerateOptions go;
  go.max_new_tokens = steps + 1;
  go.keep_logits = true;
  for (const auto& p : prompts) alone.push_back(engine::gpu::generate_gpu(gpu, p, go));

  const int64_t R = int64_t(lens.size());
  std::vector<std::vector<int32_t>> tables, seqs = prompts;
  for (int64_t r = 0; r < R; ++r) tables.push_back(gpu.alloc_pages((lens[size_t(r)] + steps + 1 + page - 1) / page));
  const int64_t g0 = gpu.stats().graph_steps;
  for (int64_t s = 0; s <= steps; ++s) {
    std::vector<int32_t> tok, pos, qo{0}, len, pp{0}, pi, rows;
    for (int64_t r = 0; r < R; ++r) {
      const auto& q = seqs[size_t(r)];
      const int64_t n = int64_t(q.size()), from = s == 0 ? 0 : n - 1;
      for (int64_t p = from; p < n; ++p) tok.push_back(q[size_t(p)]), pos.push_back(int32_t(p));
      qo.push_back(int32_t(tok.size()));
      rows.push_back(int32_t(tok.size()) - 1);
      len.push_back(int32_t(n));
      pi.insert(pi.end(), tables[size_t(r)].begin(), tables[size_t(r)].end());
      pp.push_back(int32_t(pi.size()));
    }
    engine::gpu::StepInput in;
    in.tokens = tok.data();
    in.batch = {R, int64_t(tok.size()), qo.data(), pos.data(), len.data(), pp.data(), pi.data()};
    in.logits_rows = rows;
    std::vector<float> logits;
    std::vector<int32_t> greedy;
    gpu.step(in, {&logits, &greedy, nullptr});
    for (int64_t r = 0; r < R; ++r) {
      const auto& a = alone[size_t(r)];
      const int64_t row = lens[size_t(r)] - 1 + s;  // the alone run's logits row of this position
      const float* al = a.logits.data() + row * V;
      EXPECT_LE(testing_model::rel_l2(logits.data() + r * V, al, size_t(V)), 1e-2) << "request " << r << " step " << s;
      if (testing_model::top2_margin(al, V) > 1e-2f) {
        EXPECT_EQ(greedy[size_t(r)], a.tokens[size_t(lens[size_t(r)] + s)]) << "request " << r << " step " << s;
      }
      seqs[size_t(r)].push_back(a.tokens[size_t(lens[size_t(r)] + s)]);  // both follow the alone run
    }
  }
  for (const auto& t : tables) gpu.release_pages(t);
  return gpu.stats().graph_steps - g0;
}

}  // namespace fp4moe::testing_gpu_runner
