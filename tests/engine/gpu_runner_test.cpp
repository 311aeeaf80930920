// The GPU runner against the CPU backend (its reference) on the tiny GLM-5 goldens' checkpoints
// (tests/model/golden: sparse = DSA top-16 < the 64-token prompt, dense = top-k >= context),
// each as BF16, NVIDIA's NVFP4 layout (routed experts only) and all-NVFP4 (`fp4moe quantize`):
//   - logits over 64 prompt tokens + 32 decode steps (teacher-forced on the CPU's tokens):
//     rel L2 <= 5e-2; greedy tokens identical wherever the CPU's top-2 margin > 1e-2;
//   - the prompt's hidden states layer by layer (a divergence names its layer);
//   - a batch of requests of different lengths (mixed prefill + decode) = each request alone;
//   - a decode graph replay = the eager step over the same padded batch, bit for bit.
// Every step runs with poisoned activations (NaN before the step). Skips without a GPU.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "engine/gpu/gpu_generate.hpp"
#include "engine/gpu/gpu_runner.hpp"
#include "gpu_test.hpp"
#include "model/generate.hpp"
#include "model/model_test_util.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using engine::gpu::GpuRunner;
using engine::gpu::RunnerOptions;
using testing_model::golden_dir;
using testing_model::rel_l2;

struct Case {
  std::string name, variant;  // golden folder; "bf16" | "nvfp4" | "nvfp4_all"
};

std::string model_dir(const Case& c) {
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

RunnerOptions small_options() {
  RunnerOptions o;
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

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(2 + (i * 37 + seed * 101 + 7) % (vocab - 2)));
  return p;
}

class GpuVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(GpuVsCpu, LogitsHiddenStatesAndGreedyTokensMatchTheCpuBackend) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::string dir = model_dir(GetParam());
  model::ModelOptions mo;
  mo.threads = 2;
  auto cpu = model::Model::load(dir, mo);
  auto gpu = GpuRunner::load(dir, small_options());
  const int64_t P = 64, N = 32, V = cpu->config().vocab, H = cpu->config().hidden;
  const std::vector<int32_t> prompt = prompt_of(P, V, 1);

  model::GenerateOptions go;
  go.max_new_tokens = N;
  go.keep_logits = true;
  go.kv_elem = KvElem::BF16;  // the GPU cache's element type
  model::HiddenStates hc, hg;
  go.prompt_hidden = &hc;
  const model::GenerateResult rc = model::generate(*cpu, prompt, go);
  // The GPU follows the CPU's tokens (teacher forcing): every row compares the same context.
  go.forced.assign(rc.tokens.begin() + P, rc.tokens.end());
  go.prompt_hidden = &hg;
  const model::GenerateResult rg = engine::gpu::generate_gpu(*gpu, prompt, go);

  ASSERT_EQ(rg.logits.size(), rc.logits.size());
  for (float x : rg.logits) ASSERT_TRUE(std::isfinite(x)) << "a non-finite GPU logit";
  const double all = rel_l2(rg.logits.data(), rc.logits.data(), rc.logits.size());
  EXPECT_LE(all, 5e-2) << "logits rel L2 over " << P + N - 1 << " rows";
  int64_t compared = 0;
  for (int64_t r = 0; r < P + N - 1; ++r) {
    const float* c = rc.logits.data() + r * V;
    const float* g = rg.logits.data() + r * V;
    if (testing_model::top2_margin(c, V) <= 1e-2f) continue;
    ++compared;
    EXPECT_EQ(testing_model::argmax(g, V), testing_model::argmax(c, V))
        << "row " << r << " (rel L2 " << rel_l2(g, c, size_t(V)) << ")";
  }
  EXPECT_GT(compared, (P + N) / 2) << "too few rows with a clear greedy token to compare";

  ASSERT_EQ(hg.size(), hc.size());
  for (size_t l = 0; l < hc.size(); ++l) {
    ASSERT_EQ(hg[l].size(), size_t(P * H)) << "hidden state " << l;
    const double e = rel_l2(hg[l].data(), hc[l].data(), hc[l].size());
    EXPECT_LE(e, 5e-2) << "hidden state " << l << " (0: embeddings, " << hc.size() - 1 << ": after the final norm) "
                       << "diverges: rel L2 " << e;
  }
  RecordProperty("logits_rel_l2", fmt::format("{:.3e}", all));
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* n : {"glm5-tiny-sparse", "glm5-tiny-dense"})
    for (const char* var : {"bf16", "nvfp4", "nvfp4_all"}) v.push_back({n, var});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuVsCpu, ::testing::ValuesIn(cases()), [](const auto& i) {
  std::string s = i.param.name + "_" + i.param.variant;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
});

// Requests of lengths 5, 23 and 40 prefilled in ONE step, then 6 decode steps together: each
// request's greedy tokens and logits = the request run alone.
TEST(GpuRunner, BatchOfDifferentLengthsEqualsEachRequestAlone) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::string dir = model_dir({"glm5-tiny-sparse", "nvfp4"});
  auto gpu = GpuRunner::load(dir, small_options());
  const int64_t V = gpu->config().vocab, steps = 6;
  const std::vector<int64_t> lens = {5, 23, 40};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lens.size(); ++i) prompts.push_back(prompt_of(lens[i], V, int(i) + 3));

  std::vector<model::GenerateResult> alone;
  model::GenerateOptions go;
  go.max_new_tokens = steps + 1;
  go.keep_logits = true;
  for (const auto& p : prompts) alone.push_back(engine::gpu::generate_gpu(*gpu, p, go));

  const int64_t R = int64_t(lens.size());
  std::vector<std::vector<int32_t>> tables, seqs = prompts;
  for (int64_t r = 0; r < R; ++r) tables.push_back(gpu->alloc_pages((lens[size_t(r)] + steps + 1 + 15) / 16));
  for (int64_t s = 0; s <= steps; ++s) {
    std::vector<int32_t> tok, pos, qo{0}, len, pp{0}, pi, rows;
    for (int64_t r = 0; r < R; ++r) {
      const auto& q = seqs[size_t(r)];
      const int64_t n = q.size(), from = s == 0 ? 0 : n - 1;
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
    gpu->step(in, {&logits, &greedy, nullptr});
    for (int64_t r = 0; r < R; ++r) {
      const auto& a = alone[size_t(r)];
      const int64_t row = lens[size_t(r)] - 1 + s;  // the alone run's logits row of this position
      const float* al = a.logits.data() + row * V;
      const float* bl = logits.data() + r * V;
      EXPECT_LE(rel_l2(bl, al, size_t(V)), 1e-2) << "request " << r << " step " << s;
      if (testing_model::top2_margin(al, V) > 1e-2f) {
        EXPECT_EQ(greedy[size_t(r)], a.tokens[size_t(lens[size_t(r)] + s)]) << "request " << r << " step " << s;
      }
      seqs[size_t(r)].push_back(a.tokens[size_t(lens[size_t(r)] + s)]);  // both follow the alone run
    }
  }
  for (const auto& t : tables) gpu->release_pages(t);
}

// A decode step of 3 requests (bucket 4: one padding row) replayed from the graph = the eager
// step over the same padded batch, bit for bit; so is a full bucket (8 requests).
TEST(GpuRunner, DecodeGraphReplayEqualsEagerBitForBit) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4_all"}), small_options());
  const int64_t V = gpu->config().vocab;
  for (int64_t R : {3, 8}) {
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> tok, pos, qo{0}, len, pp{0}, pi, rows;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t n = 10 + 7 * r;
      tables.push_back(gpu->alloc_pages((n + 15) / 16));
      const std::vector<int32_t> p = prompt_of(n, V, int(r));
      const int32_t ptr[2] = {0, int32_t(tables.back().size())};
      std::vector<int32_t> ps(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ps[size_t(i)] = int32_t(i);
      engine::gpu::StepInput pre;
      pre.tokens = p.data();
      const int32_t q1[2] = {0, int32_t(n - 1)}, l1[1] = {int32_t(n - 1)};
      pre.batch = {1, n - 1, q1, ps.data(), l1, ptr, tables.back().data()};
      gpu->step(pre, {});  // the first n-1 tokens into the cache
      tok.push_back(p.back());
      pos.push_back(int32_t(n - 1));
      qo.push_back(int32_t(r + 1));
      rows.push_back(int32_t(r));
      len.push_back(int32_t(n));
      pi.insert(pi.end(), tables.back().begin(), tables.back().end());
      pp.push_back(int32_t(pi.size()));
    }
    engine::gpu::StepInput in;
    in.tokens = tok.data();
    in.batch = {R, R, qo.data(), pos.data(), len.data(), pp.data(), pi.data()};
    in.logits_rows = rows;
    std::vector<float> eager, graph;
    gpu->set_graphs_enabled(false);
    const int64_t e0 = gpu->stats().eager_steps;
    gpu->step(in, {&eager, nullptr, nullptr});
    EXPECT_EQ(gpu->stats().eager_steps, e0 + 1);
    gpu->set_graphs_enabled(true);
    const int64_t g0 = gpu->stats().graph_steps;
    gpu->step(in, {&graph, nullptr, nullptr});
    EXPECT_EQ(gpu->stats().graph_steps, g0 + 1) << "the decode step did not replay a graph";
    ASSERT_EQ(eager.size(), graph.size());
    for (size_t i = 0; i < eager.size(); ++i) {
      ASSERT_TRUE(std::isfinite(eager[i])) << "R " << R << " logit " << i;
      ASSERT_EQ(std::memcmp(&eager[i], &graph[i], 4), 0) << "R " << R << " row " << i / size_t(V) << " col "
                                                         << i % size_t(V) << ": " << eager[i] << " vs " << graph[i];
    }
    for (const auto& t : tables) gpu->release_pages(t);
  }
}

TEST(GpuRunner, BadBatchIsOneErrorLine) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-dense", "bf16"}), small_options());
  const std::vector<int32_t> table = gpu->alloc_pages(1);
  const int32_t tok[1] = {int32_t(gpu->config().vocab)}, pos[1] = {0}, qo[2] = {0, 1}, len[1] = {1}, pp[2] = {0, 1};
  engine::gpu::StepInput in;
  in.tokens = tok;
  in.batch = {1, 1, qo, pos, len, pp, table.data()};
  in.logits_rows = {0};
  EXPECT_THROW(gpu->step(in, {}), Error);
  const int32_t far[1] = {100000};
  in.tokens = pos;
  in.batch.positions = far;
  EXPECT_THROW(gpu->step(in, {}), Error);
}

}  // namespace
}  // namespace fp4moe
