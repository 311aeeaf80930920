// The GPU runner's K greedy decode steps per launch (GpuRunner::decode_greedy) and its
// per-expert token counts (StepOutput::expert_counts), on the tiny GLM-5 golden (sparse):
//   - K steps in one launch = K single greedy steps (step()), bit for bit: tokens, the last
//     step's logits, the expert counts of every step; K = 1, 2, 4, 8, graphs on and off;
//   - a request that hits max_new or a stop id at step j < K produces exactly its tokens up to
//     it, and the other requests' tokens and last logits are those of the launch without limits
//     (the max_new request's page table ends where its last token goes: a write past it would
//     land in its neighbour's first page);
//   - the counts: per MoE layer and step they sum to (running requests) × top_k, padding rows
//     of a graph bucket not counted; graph replay = eager over the same padded batch; an eager
//     step's counts = the histogram of its routing ids (StepChoices).
// Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "gpu_test.hpp"

namespace fp4moe {
namespace {

using engine::gpu::DecodeInput;
using engine::gpu::GpuRunner;
using engine::gpu::StepInput;
using engine::gpu::StepOutput;
using testing_gpu_runner::model_dir;
using testing_gpu_runner::prompt_of;
using testing_gpu_runner::small_options;
using testing_gpu_runner::Decoding;
using testing_gpu_runner::prefill;

constexpr int64_t kPage = 16;  // small_options().page_size

// Per MoE layer of one step's counts [moe_layers, E]: the tokens counted.
std::vector<int64_t> layer_sums(const int32_t* counts, int64_t layers, int64_t E) {
  std::vector<int64_t> s(static_cast<size_t>(layers), 0);
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t e = 0; e < E; ++e) s[size_t(l)] += counts[l * E + e];
  return s;
}

TEST(GpuDecode, KStepsPerLaunchEqualKSingleGreedyStepsBitForBit) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4_all"}), small_options());
  const int64_t V = gpu->config().vocab, ML = gpu->num_moe_layers(), E = gpu->num_experts(),
                k = gpu->config().moe.top_k, B = 3;  // bucket 4: one padding row
  ASSERT_GT(ML, 0) << "the tiny sparse golden has MoE layers";
  Decoding d = prefill(*gpu, {10, 17, 24}, 8);
  for (bool graphs : {true, false}) {
    gpu->set_graphs_enabled(graphs);
    for (int32_t K : {1, 2, 4, 8}) {
      SCOPED_TRACE(testing::Message() << "graphs " << graphs << " K " << K);
      // K single steps, the host advancing the batch.
      Decoding s = d;
      std::vector<std::vector<int32_t>> single;
      std::vector<int32_t> counts_single, greedy, counts;
      std::vector<float> logits;
      for (int32_t j = 0; j < K; ++j) {
        StepInput in;
        in.tokens = s.tok.data();
        in.batch = s.batch();
        in.logits_rows = {0, 1, 2};
        StepOutput o;
        o.logits = &logits;
        o.greedy = &greedy;
        o.expert_counts = &counts;
        gpu->step(in, o);
        single.push_back(greedy);
        counts_single.insert(counts_single.end(), counts.begin(), counts.end());
        for (int64_t r = 0; r < B; ++r) s.tok[size_t(r)] = greedy[size_t(r)], ++s.pos[size_t(r)], ++s.len[size_t(r)];
      }
      // One launch.
      DecodeInput di;
      di.tokens = d.tok.data();
      di.batch = d.batch();
      di.steps = K;
      std::vector<int32_t> out, produced, kcounts;
      std::vector<float> last;
      const int64_t g0 = gpu->stats().graph_steps;
      gpu->decode_greedy(di, out, produced, &kcounts, &last);
      EXPECT_EQ(gpu->stats().graph_steps - g0, graphs ? K : 0);
      ASSERT_EQ(out.size(), size_t(K * B));
      ASSERT_EQ(produced, std::vector<int32_t>(size_t(B), K));
      for (int32_t j = 0; j < K; ++j)
        for (int64_t r = 0; r < B; ++r)
          EXPECT_EQ(out[size_t(j * B + r)], single[size_t(j)][size_t(r)]) << "step " << j << " request " << r;
      ASSERT_EQ(last.size(), logits.size());
      for (size_t i = 0; i < last.size(); ++i)
        ASSERT_EQ(std::memcmp(&last[i], &logits[i], 4), 0)
            << "last step's logits, row " << i / size_t(V) << " col " << i % size_t(V) << ": " << last[i] << " vs "
            << logits[i];
      ASSERT_EQ(kcounts.size(), size_t(K * ML * E));
      EXPECT_EQ(kcounts, counts_single) << "per-expert counts of the launch vs the single steps";
      for (int32_t j = 0; j < K; ++j)
        EXPECT_EQ(layer_sums(kcounts.data() + j * ML * E, ML, E), std::vector<int64_t>(size_t(ML), B * k))
            << "step " << j << ": every MoE layer counts B x top_k tokens (padding not counted)";
    }
  }
  d.release(*gpu);
}

TEST(GpuDecode, MaxNewAndStopIdFinishARequestEarlyAndLeaveTheOthersAlone) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4_all"}), small_options());
  const int64_t V = gpu->config().vocab, ML = gpu->num_moe_layers(), E = gpu->num_experts(),
                k = gpu->config().moe.top_k, B = 4;
  const int32_t K = 8;
  // Request 1's last token sits at position 14: max_new 2 writes positions 14 and 15, the end of
  // its first page; request 2's pages follow it in the page table.
  Decoding d = prefill(*gpu, {12, 15, 20, 27}, K);
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(testing::Message() << "graphs " << graphs);
    gpu->set_graphs_enabled(graphs);
    DecodeInput di;
    di.tokens = d.tok.data();
    di.batch = d.batch();
    di.steps = K;
    std::vector<int32_t> ref, produced, out, counts;
    std::vector<float> ref_logits, logits;
    gpu->decode_greedy(di, ref, produced, nullptr, &ref_logits);
    ASSERT_EQ(produced, std::vector<int32_t>(size_t(B), K));

    // Request 3 stops at the first step j >= 1 whose token it has not produced before (else 0).
    int32_t js = 0;
    for (int32_t j = 1; j < K - 1 && js == 0; ++j) {
      bool seen = false;
      for (int32_t i = 0; i < j; ++i) seen = seen || ref[size_t(i * B + 3)] == ref[size_t(j * B + 3)];
      if (!seen) js = j;
    }
    Decoding lim = d;
    lim.pi.clear();
    lim.pp = {0};
    for (int64_t r = 0; r < B; ++r) {
      const auto& t = d.tables[size_t(r)];
      lim.pi.insert(lim.pi.end(), t.begin(), r == 1 ? t.begin() + 1 : t.end());
      lim.pp.push_back(int32_t(lim.pi.size()));
    }
    const std::vector<int32_t> max_new = {K, 2, K, K};
    di.batch = lim.batch();
    di.max_new = max_new.data();
    di.stop_ids = {{-5}, {}, {}, {ref[size_t(js * B + 3)]}};
    gpu->decode_greedy(di, out, produced, &counts, &logits);
    const std::vector<int32_t> want = {K, 2, K, js + 1};
    EXPECT_EQ(produced, want);
    for (int32_t j = 0; j < K; ++j)
      for (int64_t r = 0; r < B; ++r) {
        const int32_t expect = j < want[size_t(r)] ? ref[size_t(j * B + r)] : -1;
        EXPECT_EQ(out[size_t(j * B + r)], expect) << "step " << j << " request " << r;
      }
    for (int64_t r : {0, 2}) {
      int64_t differ = 0;
      double worst = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        const size_t i = size_t(r * V + v);
        if (std::memcmp(&logits[i], &ref_logits[i], 4) == 0) continue;
        ++differ;
        worst = std::max(worst, double(std::fabs(logits[i] - ref_logits[i])));
      }
      EXPECT_EQ(differ, 0) << "request " << r << ": last-step logits differ from the launch without limits (max abs "
                           << worst << ")";
    }
    ASSERT_EQ(counts.size(), size_t(K * ML * E));
    for (int32_t j = 0; j < K; ++j) {
      int64_t running = 0;
      for (int32_t w : want) running += w > j ? 1 : 0;
      EXPECT_EQ(layer_sums(counts.data() + j * ML * E, ML, E), std::vector<int64_t>(size_t(ML), running * k))
          << "step " << j << ": finished requests are not counted";
    }
  }
  d.release(*gpu);
}

// One step's counts = the histogram of the routing ids the eager step reports (StepChoices),
// for the FP4 MoE layer and the BF16-experts fallback; a graph bucket's padding row not counted.
TEST(GpuDecode, ExpertCountsOfAStepAreTheRoutingHistogramOfRealTokens) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (const char* variant : {"nvfp4_all", "bf16"}) {
    SCOPED_TRACE(variant);
    auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", variant}), small_options());
    const int64_t ML = gpu->num_moe_layers(), E = gpu->num_experts(), k = gpu->config().moe.top_k, B = 3;
    Decoding d = prefill(*gpu, {9, 30, 14}, 1);
    StepInput in;
    in.tokens = d.tok.data();
    in.batch = d.batch();
    in.logits_rows = {0, 1, 2};
    std::vector<int32_t> graph_counts, padded_counts, eager_counts;
    StepOutput o;
    o.expert_counts = &graph_counts;
    const int64_t g0 = gpu->stats().graph_steps;
    gpu->step(in, o);
    EXPECT_EQ(gpu->stats().graph_steps, g0 + 1);
    gpu->set_graphs_enabled(false);  // the same padded batch, eager
    o.expert_counts = &padded_counts;
    gpu->step(in, o);
    gpu->set_graphs_enabled(true);
    EXPECT_EQ(graph_counts, padded_counts) << "graph replay vs eager over the same batch padded to 4";
    // Eager, unpadded, with the routing ids (per-layer results: 3 rows; numerically a different
    // run, so compared with its own ids only).
    engine::gpu::StepChoices ch;
    o.expert_counts = &eager_counts;
    o.choices = &ch;
    gpu->step(in, o);
    EXPECT_EQ(layer_sums(graph_counts.data(), ML, E), std::vector<int64_t>(size_t(ML), B * k))
        << "the graph bucket's padding row is not counted";
    const std::vector<int32_t> ids = gpu->moe_layer_ids();
    ASSERT_EQ(int64_t(ids.size()), ML);
    ASSERT_EQ(eager_counts.size(), size_t(ML * E));
    for (int64_t l = 0; l < gpu->config().num_layers; ++l) {
      const auto it = std::find(ids.begin(), ids.end(), int32_t(l));
      EXPECT_EQ(it != ids.end(), !ch.expert_ids[size_t(l)].empty()) << "layer " << l;
      if (it == ids.end()) continue;
      std::vector<int32_t> hist(static_cast<size_t>(E), 0);
      for (int32_t e : ch.expert_ids[size_t(l)]) ++hist[size_t(e)];
      const int64_t m = it - ids.begin();
      EXPECT_EQ(std::vector<int32_t>(eager_counts.begin() + m * E, eager_counts.begin() + (m + 1) * E), hist)
          << "layer " << l;
      EXPECT_EQ(layer_sums(eager_counts.data() + m * E, 1, E)[0], B * k);
    }
    d.release(*gpu);
  }
}

TEST(GpuDecode, BadDecodeInputIsOneErrorLine) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-dense", "bf16"}), small_options());
  Decoding d = prefill(*gpu, {15}, 2);  // position 14, one page: room for 2 steps
  std::vector<int32_t> out, produced;
  DecodeInput di;
  di.tokens = d.tok.data();
  di.batch = d.batch();
  for (int32_t K : {0, 3, 17}) {
    di.steps = K;
    EXPECT_THROW(gpu->decode_greedy(di, out, produced), Error) << "K " << K;
  }
  const int32_t zero = 0, two = 2;
  di.steps = 3;
  di.max_new = &two;  // writes 2 positions: fits
  EXPECT_NO_THROW(gpu->decode_greedy(di, out, produced));
  di.max_new = &zero;
  EXPECT_THROW(gpu->decode_greedy(di, out, produced), Error);
  di.max_new = nullptr;
  di.steps = 2;
  di.stop_ids = {std::vector<int32_t>(size_t(small_options().max_stop_ids) + 1, 1)};
  EXPECT_THROW(gpu->decode_greedy(di, out, produced), Error);
  d.release(*gpu);
}

}  // namespace
}  // namespace fp4moe
