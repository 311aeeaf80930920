// The GPU runner against the CPU backend (its reference) on the tiny GLM-5 goldens' checkpoints
// (tests/model/golden: sparse = DSA top-16 < the 64-token prompt, dense = top-k >= context),
// each as BF16, NVIDIA's NVFP4 layout (routed experts only) and all-NVFP4 (`fp4moe quantize`):
//   - logits over 64 prompt tokens + 32 decode steps (teacher-forced on a fixed continuation):
//     rel L2 <= 5e-2; greedy tokens identical wherever the CPU's top-2 margin > 1e-2;
//   - the prompt's hidden states layer by layer (a divergence names its layer);
//   - a batch of requests of different lengths (mixed prefill + decode) = each request alone;
//   - a decode graph replay = the eager step over the same padded batch, bit for bit.
// The CPU reference of the GPU-vs-CPU comparison takes the GPU's discrete choices (routing,
// top-k) so that near-ties do not decide the result (see the test). Every step runs with poisoned activations (NaN before the step). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "cpu/moe_cpu.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "gpu_test.hpp"
#include "model/model_test_util.hpp"

namespace fp4moe {
namespace {

using engine::gpu::GpuRunner;
using engine::gpu::RunnerOptions;
using testing_gpu_runner::Case;
using testing_gpu_runner::model_dir;
using testing_gpu_runner::prompt_of;
using testing_gpu_runner::small_options;
using testing_gpu_runner::GpuSequenceForward;
using testing_gpu_runner::gpu_forward_sequence;
using testing_model::rel_l2;

class GpuVsCpu : public ::testing::TestWithParam<Case> {};

// The ungrouped margin between the k-th and (k+1)-th biased scores of one token's router
// logits (a diagnostic: how close the CPU's own choice was to a tie).
float route_margin(const MoeConfig& c, const float* logits, const std::vector<float>& bias) {
  std::vector<float> sc(size_t(c.num_experts));
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t e = 0; e < c.num_experts; ++e) mx = std::max(mx, logits[e]);
  for (int64_t e = 0; e < c.num_experts; ++e) sum += std::exp(logits[e] - mx);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const float s = c.scoring == ScoringFunc::Sigmoid ? 1.0f / (1.0f + std::exp(-logits[e])) : std::exp(logits[e] - mx) / sum;
    sc[size_t(e)] = s + (bias.empty() ? 0.0f : bias[size_t(e)]);
  }
  std::sort(sc.rbegin(), sc.rend());
  return c.top_k < c.num_experts ? sc[size_t(c.top_k - 1)] - sc[size_t(c.top_k)] : INFINITY;
}

std::vector<int32_t> sorted_ids(const int32_t* ids, int64_t k) {
  std::vector<int32_t> v(ids, ids + k);
  std::sort(v.begin(), v.end());
  return v;
}

// Discrete choices (MoE routing, the DSA top-k) are near-ties for some tokens: BF16 rounding of
// the activations breaks them differently from the CPU's FP32, and such a token's output then
// differs by O(1) (measured on the CPU alone: rounding only the MoE input to BF16 flips tokens 45
// and 46 of glm5-tiny-sparse, rel L2 0.16 / 0.35). So:
//   1. the CPU alone, its own choices observed;
//   2. the GPU, teacher-forced on the CPU's tokens, its choices recorded per step and layer;
//   3. the GPU's expert ids = the CPU's selection over the GPU's own router logits, everywhere;
//   4. diagnostics against the CPU alone: hidden states per layer, for the first one off its
//      worst rows and whether their experts match the CPU's own (with the CPU's score margin);
//   5. the CPU again with the GPU's choices imposed (model::StepChoiceHooks): the bounds
//      (logits rel L2 <= 5e-2, greedy tokens where the top-2 margin > 1e-2, hidden states
//      <= 5e-2 per layer) hold against it.
// kv: both caches' element (BF16; or FP8 E4M3, scale 1.0 on both sides: the CPU's `--kv-dtype
// fp8` against the runner's --kv-cache-dtype fp8_e4m3). The same bounds either way: both sides
// round the same keys to E4M3, and a code differs only where the key's BF16 (GPU) and FP32 (CPU)
// values straddle a rounding boundary (one E4M3 step, 2^-3 relative, on a few elements).
void gpu_vs_cpu(const Case& c, KvElem kv) {
  const std::string dir = model_dir(c);
  model::ModelOptions mo;
  mo.threads = 2;
  auto cpu = model::Model::load(dir, mo);
  RunnerOptions ro = small_options();
  ro.kv_elem = kv;
  auto gpu = GpuRunner::load(dir, ro);
  const model::MlaModelConfig& cfg = cpu->config();
  const int64_t P = 64, N = 32, V = cfg.vocab, H = cfg.hidden, L = cfg.num_layers;
  // The prompt, then N - 1 decode steps over a fixed continuation (teacher forcing: every row of
  // every run below compares the same context).
  const std::vector<int32_t> seq = prompt_of(P + N - 1, V, 1);

  // 1. The CPU alone; its prefill routing kept per MoE layer.
  std::map<int64_t, std::pair<std::vector<float>, std::vector<int32_t>>> own;
  cpu->options().hooks.on_routing = [&](int64_t l, int64_t T, const float* lg, const int32_t* ids) {
    if (T != P) return;
    const MoeConfig& mc = cpu->weights().layers[size_t(l)].moe.cfg;
    own[l] = {std::vector<float>(lg, lg + T * mc.num_experts), std::vector<int32_t>(ids, ids + T * mc.top_k)};
  };
  testing_model::ForwardOptions fo;
  fo.kv_elem = kv;  // the GPU cache's element type
  fo.hidden = true;
  const testing_model::SequenceForward rc = testing_model::forward_sequence(*cpu, seq, P, fo);
  const model::HiddenStates& hc = rc.hidden;
  cpu->options().hooks = {};

  // 2. The GPU on the CPU's tokens (teacher forcing: every row compares the same context).
  const GpuSequenceForward rg = gpu_forward_sequence(*gpu, seq, P);
  const model::HiddenStates& hg = rg.hidden;
  const std::vector<engine::gpu::StepChoices>& ch = rg.choices;
  ASSERT_EQ(int64_t(ch.size()), N) << "one record per step (prefill + decode)";
  ASSERT_EQ(rg.logits.size(), rc.logits.size());
  for (float x : rg.logits) ASSERT_TRUE(std::isfinite(x)) << "a non-finite GPU logit";

  // 3. The GPU router's selection = the CPU's on the same logits.
  for (size_t st = 0; st < ch.size(); ++st)
    for (int64_t l = 0; l < L; ++l) {
      const auto& lg = ch[st].router_logits[size_t(l)];
      if (lg.empty()) continue;
      const MoeLayerWeights& mw = cpu->weights().layers[size_t(l)].moe;
      const int64_t T = int64_t(lg.size()) / mw.cfg.num_experts;
      const RoutingResult r = route_cpu(mw.cfg, lg.data(), mw.router_bias.empty() ? nullptr : mw.router_bias.data(), T);
      const auto& ids = ch[st].expert_ids[size_t(l)];
      ASSERT_EQ(ids.size(), r.topk_ids.size());
      for (int64_t t = 0; t < T; ++t)
        EXPECT_EQ(sorted_ids(ids.data() + t * mw.cfg.top_k, mw.cfg.top_k),
                  sorted_ids(r.topk_ids.data() + t * mw.cfg.top_k, mw.cfg.top_k))
            << "step " << st << " layer " << l << " token " << t << ": the GPU router chose other experts than the "
            << "CPU selection over the GPU's own logits";
    }

  // 4. Against the CPU alone (printed, not asserted: near-ties decide these).
  ASSERT_EQ(hg.size(), hc.size());
  const double alone = rel_l2(rg.logits.data(), rc.logits.data(), rc.logits.size());
  std::printf("[ info ] against the CPU alone: logits rel L2 %.3e\n", alone);
  bool reported = false;
  for (size_t l = 0; l < hc.size(); ++l) {
    ASSERT_EQ(hg[l].size(), size_t(P * H)) << "hidden state " << l;
    const double e = rel_l2(hg[l].data(), hc[l].data(), hc[l].size());
    std::printf("[ info ]   hidden state %zu rel L2 %.3e\n", l, e);
    if (e <= 5e-2 || reported) continue;
    reported = true;
    std::vector<std::pair<double, int64_t>> rows;
    for (int64_t t = 0; t < P; ++t) rows.push_back({rel_l2(hg[l].data() + t * H, hc[l].data() + t * H, size_t(H)), t});
    std::sort(rows.rbegin(), rows.rend());
    for (size_t i = 0; i < std::min<size_t>(6, rows.size()); ++i) {
      const int64_t t = rows[i].second;
      std::string routes;
      for (const auto& [ml, r] : own) {
        if (ml >= int64_t(l)) break;  // layers up to this hidden state (state l = after layer l-1)
        const MoeLayerWeights& mw = cpu->weights().layers[size_t(ml)].moe;
        const int64_t k = mw.cfg.top_k;
        const bool same = sorted_ids(ch[0].expert_ids[size_t(ml)].data() + t * k, k) == sorted_ids(r.second.data() + t * k, k);
        routes += fmt::format(" layer {}: {} (CPU margin {:.1e})", ml, same ? "same experts" : "OTHER EXPERTS",
                              route_margin(mw.cfg, r.first.data() + t * mw.cfg.num_experts, mw.router_bias));
      }
      std::printf("[ info ]     token %ld (position %ld, page %ld) rel L2 %.3f;%s\n", long(t), long(t), long(t / small_options().page_size),
                  rows[i].first, routes.c_str());
    }
  }

  // 5. The CPU with the GPU's choices.
  std::map<int64_t, size_t> rcur, kcur;
  std::vector<int32_t> forced_topk;
  cpu->options().hooks.router_logits = [&](int64_t l, int64_t T) -> const float* {
    const size_t st = rcur[l]++;
    EXPECT_LT(st, ch.size());
    if (st >= ch.size()) return nullptr;
    const auto& v = ch[st].router_logits[size_t(l)];
    EXPECT_EQ(int64_t(v.size()), T * cfg.moe.num_experts) << "step " << st << " layer " << l;
    return v.data();
  };
  cpu->options().hooks.topk_positions = [&](int64_t l, int64_t T, int64_t k) -> const int32_t* {
    const size_t st = kcur[l]++;
    EXPECT_LT(st, ch.size());
    if (st >= ch.size()) return nullptr;
    const auto& v = ch[st].topk_positions[size_t(l)];
    const int64_t K = cfg.index_topk;
    EXPECT_EQ(int64_t(v.size()), T * K) << "step " << st << " layer " << l;
    forced_topk.assign(size_t(T * k), -1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t p = v[size_t(t * K + j)];
        if (j < k) forced_topk[size_t(t * k + j)] = p;
        else EXPECT_EQ(p, -1) << "step " << st << " layer " << l << ": more than " << k << " keys selected";
      }
    return forced_topk.data();
  };
  const testing_model::SequenceForward rf = testing_model::forward_sequence(*cpu, seq, P, fo);
  const model::HiddenStates& hf = rf.hidden;
  cpu->options().hooks = {};
  for (const auto& [l, n] : rcur) EXPECT_EQ(n, ch.size()) << "layer " << l << " routed " << n << " steps";

  const double all = rel_l2(rg.logits.data(), rf.logits.data(), rf.logits.size());
  EXPECT_LE(all, 5e-2) << "logits rel L2 over " << P + N - 1 << " rows (the CPU on the GPU's choices)";
  int64_t compared = 0;
  for (int64_t r = 0; r < P + N - 1; ++r) {
    const float* c = rf.logits.data() + r * V;
    const float* g = rg.logits.data() + r * V;
    // A clear greedy token: the CPU's top-2 margin above the row's measured noise (noise_margin,
    // 8 x the RMS of the two rows' difference) and above 1e-2.
    if (testing_model::top2_margin(c, V) <= std::max(1e-2f, testing_model::noise_margin(g, c, V))) continue;
    ++compared;
    EXPECT_EQ(testing_model::argmax(g, V), testing_model::argmax(c, V))
        << "row " << r << " (rel L2 " << rel_l2(g, c, size_t(V)) << ")";
  }
  EXPECT_GT(compared, (P + N) / 2) << "too few rows with a clear greedy token to compare";
  int64_t agree = 0;  // greedy agreement over every row (printed: near-ties included)
  for (int64_t r = 0; r < P + N - 1; ++r)
    agree += testing_model::argmax(rg.logits.data() + r * V, V) == testing_model::argmax(rf.logits.data() + r * V, V);
  std::printf("[ info ] KV %s: logits rel L2 %.3e (the CPU on the GPU's choices); greedy agreement %lld / %lld rows "
              "(%lld with a top-2 margin above the row's noise asserted)\n",
              std::string(kv_elem_name(kv)).c_str(), all, (long long)agree, (long long)(P + N - 1), (long long)compared);
  ASSERT_EQ(hf.size(), hg.size());
  for (size_t l = 0; l < hf.size(); ++l) {
    const double e = rel_l2(hg[l].data(), hf[l].data(), hf[l].size());
    double worst = 0.0;
    int64_t wt = 0;
    for (int64_t t = 0; t < P; ++t) {
      const double et = rel_l2(hg[l].data() + t * H, hf[l].data() + t * H, size_t(H));
      if (et > worst) worst = et, wt = t;
    }
    EXPECT_LE(e, 5e-2) << "hidden state " << l << " (0: embeddings, " << hf.size() - 1 << ": after the final norm) "
                       << "diverges: rel L2 " << e << "; worst token " << wt << " (rel L2 " << worst << ")";
  }
  ::testing::Test::RecordProperty("logits_rel_l2", fmt::format("{:.3e}", all));
  ::testing::Test::RecordProperty("logits_rel_l2_cpu_alone", fmt::format("{:.3e}", alone));
  ::testing::Test::RecordProperty("greedy_agreement", fmt::format("{}/{}", agree, P + N - 1));
}

TEST_P(GpuVsCpu, LogitsHiddenStatesAndGreedyTokensMatchTheCpuBackend) {
  FP4MOE_SKIP_WITHOUT_GPU();
  gpu_vs_cpu(GetParam(), KvElem::BF16);
}

// --kv-cache-dtype fp8_e4m3 (issue 40): the runner's FP8 cache (its kv_append_fp8,
// mla_attention_warp_fp8 and indexer_scores_warp_fp8 on these dims) against the CPU model's FP8
// cache, with the GPU's routing and top-k imposed, at the BF16 runner's bounds.
class GpuVsCpuFp8Kv : public ::testing::TestWithParam<Case> {};

TEST_P(GpuVsCpuFp8Kv, LogitsHiddenStatesAndGreedyTokensMatchTheCpuBackend) {
  FP4MOE_SKIP_WITHOUT_GPU();
  gpu_vs_cpu(GetParam(), KvElem::FP8_E4M3);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* n : {"glm5-tiny-sparse", "glm5-tiny-dense"})
    for (const char* var : {"bf16", "nvfp4", "nvfp4_all"}) v.push_back({n, var});
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  std::string s = i.param.name + "_" + i.param.variant;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuVsCpu, ::testing::ValuesIn(cases()), case_name);

std::vector<Case> fp8_kv_cases() {
  std::vector<Case> v;
  for (const char* n : {"glm5-tiny-sparse", "glm5-tiny-dense"})
    for (const char* var : {"bf16", "nvfp4"}) v.push_back({n, var});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuVsCpuFp8Kv, ::testing::ValuesIn(fp8_kv_cases()), case_name);

// Requests of lengths 5, 23 and 40 prefilled in ONE step, then 6 decode steps together: each
// request's greedy tokens and logits = the request run alone.
TEST(GpuRunner, BatchOfDifferentLengthsEqualsEachRequestAlone) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4"}), small_options());
  testing_gpu_runner::expect_batch_equals_alone(*gpu, {5, 23, 40}, 6, 3);
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
    testing_gpu_runner::expect_bitwise_equal(eager, graph, V, "R " + std::to_string(R));
    for (const auto& t : tables) gpu->release_pages(t);
  }
}

// FP8 KV: the plan line counts 1 B per element (half the BF16 bytes per token, so at least 1.9x
// the tokens from the same pool budget); bad scales and f32 are one-line load errors.
TEST(GpuRunner, Fp8KvCacheHalvesTheBytesPerTokenAndRefusesBadScales) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::string dir = model_dir({"glm5-tiny-sparse", "bf16"});
  RunnerOptions ro = small_options();
  ro.max_total_tokens = 0;  // the pool from the budget, not a token cap
  ro.mem_fraction_static = 0.3;
  int64_t bf_tokens = 0, bf_bytes = 0;
  {
    auto bf = GpuRunner::load(dir, ro);
    bf_tokens = bf->num_pages() * bf->page_size(), bf_bytes = bf->kv_bytes_per_token();
  }
  ro.kv_elem = KvElem::FP8_E4M3;
  auto f8 = GpuRunner::load(dir, ro);
  EXPECT_EQ(f8->kv_bytes_per_token() * 2, bf_bytes);
  const double ratio = double(f8->num_pages() * f8->page_size()) / double(bf_tokens);
  std::printf("[ info ] KV pool: BF16 %lld tokens (%lld B/token), FP8 %lld tokens (%lld B/token): %.3fx\n",
              (long long)bf_tokens, (long long)bf_bytes, (long long)(f8->num_pages() * f8->page_size()),
              (long long)f8->kv_bytes_per_token(), ratio);
  EXPECT_GE(ratio, 1.9);
  for (float bad : {-1.0f, INFINITY, NAN}) {
    RunnerOptions b = small_options();
    b.kv_elem = KvElem::FP8_E4M3;
    b.kv_index_scale = bad;
    try {
      GpuRunner::load(dir, b);
      ADD_FAILURE() << "index scale " << bad << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_NE(m.find("must be positive and finite"), std::string::npos) << m;
    }
  }
  RunnerOptions f32 = small_options();
  f32.kv_elem = KvElem::F32;
  EXPECT_THROW(GpuRunner::load(dir, f32), Error);
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
