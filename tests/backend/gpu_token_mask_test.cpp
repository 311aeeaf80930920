// Grammar masks on the GPU runner (StepInput::token_masks, cuda/sampling/token_bitmask_f32), on
// the tiny GLM-5 golden (sparse, all-NVFP4). Each decode step runs twice over the same KV slots
// (the same values written again): unmasked, for the step's own logits, then masked:
//   - the masked logits = cpu::apply_token_bitmask over the unmasked ones, bit for bit, and the
//     rows without a mask are untouched;
//   - plain greedy rows: the device argmax = the CPU argmax of the masked row, always an allowed
//     token (the masks allow ~6 tokens and never the unmasked argmax, so an unapplied mask fails);
//   - every sampling mode (temperature + top-p, top-k + min-p + penalties, greedy + penalty,
//     logprobs): the device token = cpu::sample_cpu over the masked row (rows failing cpu::stable_draw allowed
//     and counted, as in gpu_sampling_test), allowed; a one-token mask gives that token in every
//     mode, with logprob 0;
//   - graph replay (the mask launch captured, its slots and masks at fixed addresses) = eager over
//     the same padded batch, bit for bit (tokens and masked logits), and a step without masks
//     after a masked one is unmasked again (the slots reset);
//   - masks filled during the step (StepInput::await_token_masks) = masks given before it.
// Skips without a GPU.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/row_ops_cpu.hpp"
#include "cpu/sampling_cpu.hpp"
#include "backend/device_sampling.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "backend/gpu_sampling_rows.hpp"
#include "gpu_test.hpp"

namespace fp4moe {
namespace {

using cpu::SamplingParams;
using engine::GeneratedToken;
using engine::gpu::GpuRunner;
using engine::gpu::StepInput;
using engine::gpu::StepOutput;
using testing_gpu_runner::Decoding;
using testing_gpu_runner::model_dir;
using testing_gpu_runner::prefill;
using testing_gpu_runner::small_options;

bool allowed(const std::vector<uint32_t>& m, int32_t t) { return t >= 0 && ((m[size_t(t) >> 5] >> (t & 31)) & 1u); }

// A mask of `n` random tokens, never `avoid` (the row's unmasked argmax).
std::vector<uint32_t> few_tokens(int64_t V, int n, int32_t avoid, std::mt19937_64& g) {
  std::vector<uint32_t> m(size_t((V + 31) / 32), 0u);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V) - 1);
  for (int k = 0; k < n;) {
    const int32_t t = d(g);
    if (t == avoid || allowed(m, t)) continue;
    m[size_t(t) >> 5] |= 1u << (t & 31);
    ++k;
  }
  return m;
}

std::vector<const uint32_t*> pointers(const std::vector<std::vector<uint32_t>>& masks) {
  std::vector<const uint32_t*> p;
  for (const auto& m : masks) p.push_back(m.empty() ? nullptr : m.data());
  return p;
}

TEST(GpuTokenMasks, MaskedGreedyAndSampledStepsEqualTheHostOnTheStepsOwnLogits) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4_all"}), small_options());
  const int64_t V = gpu->config().vocab, steps = 5;
  const std::vector<int64_t> lens = {10, 17, 24, 13, 9, 30, 11, 20};  // every mode twice
  const int64_t B = int64_t(lens.size());
  Decoding d = prefill(*gpu, lens, steps + 1);
  testing_gpu_runner::SampledRequests q(lens, V, 4242);  // every sampling mode (gpu_sampling_rows.hpp)
  std::mt19937_64 g(7);
  int near = 0, rows = 0;
  for (int64_t s = 0; s < steps; ++s) {
    // Unmasked: the step's logits.
    std::vector<float> raw;
    std::vector<int32_t> raw_greedy;
    StepOutput o0;
    o0.logits = &raw;
    o0.greedy = &raw_greedy;
    gpu->step(d.step({}), o0);
    // Masks: rows 0..5 a few tokens each (row 4 + s: one token); rows 6, 7 unconstrained.
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(B));
    for (int64_t r = 0; r < 6; ++r)
      masks[size_t(r)] = few_tokens(V, r == (4 + s) % 6 ? 1 : 6, raw_greedy[size_t(r)], g);
    StepInput in = d.step(q.rows());
    in.token_masks = pointers(masks);
    std::vector<float> logits;
    std::vector<int32_t> greedy;
    std::vector<GeneratedToken> sampled;
    StepOutput o;
    o.logits = &logits;
    o.greedy = &greedy;
    o.sampled = &sampled;
    gpu->step(in, o);
    ASSERT_EQ(sampled.size(), size_t(B));
    std::vector<float> ref = raw;
    for (int64_t r = 0; r < B; ++r)
      if (!masks[size_t(r)].empty()) cpu::apply_token_bitmask(ref.data() + r * V, V, masks[size_t(r)].data());
    ASSERT_EQ(logits.size(), ref.size());
    EXPECT_EQ(std::memcmp(logits.data(), ref.data(), ref.size() * 4), 0) << "step " << s << ": masked logits";
    std::vector<int32_t> am(static_cast<size_t>(B));
    cpu::argmax_rows_cpu(ref.data(), int(B), int(V), am.data());
    EXPECT_EQ(greedy, am) << "step " << s << ": the masked argmax";
    for (int64_t r = 0; r < B; ++r) {
      const std::string what = "step " + std::to_string(s) + " row " + std::to_string(r);
      const auto& m = masks[size_t(r)];
      const int32_t t = sampled[size_t(r)].id;
      if (!m.empty()) {
        EXPECT_TRUE(allowed(m, t)) << what << ": token " << t << " is not allowed";
      }
      const auto h = cpu::sample_cpu(ref.data() + r * V, V, q.params[size_t(r)], q.prompt[size_t(r)],
                                            q.gen[size_t(r)], q.gen[size_t(r)].size());
      if (t != h.token) {
        EXPECT_TRUE(!cpu::stable_draw(h, 0.0))
            << what << ": device " << t << ", host " << h.token << " (margins " << h.draw_margin << ", "
            << h.cut_margin << ")";
        ++near;
      } else if (q.params[size_t(r)].logprobs_top_n >= 0) {
        EXPECT_NEAR(sampled[size_t(r)].logprob, h.logprob, 1e-4f) << what;
      }
      int bits = 0;
      for (uint32_t w : m) bits += std::popcount(w);
      if (bits == 1) {  // a one-token mask: that token, logprob 0, in every mode
        if (q.params[size_t(r)].logprobs_top_n >= 0) {
          EXPECT_NEAR(sampled[size_t(r)].logprob, 0.0f, 1e-6f) << what;
        }
      }
      ++rows;
      q.gen[size_t(r)].push_back(t);
      d.tok[size_t(r)] = t, ++d.pos[size_t(r)], ++d.len[size_t(r)];
    }
  }
  RecordProperty("near_tie_rows", near);
  EXPECT_LE(near * 50, rows) << near << " near-tie rows of " << rows << " (<= 2 %)";
  d.release(*gpu);
}

TEST(GpuTokenMasks, GraphReplayWithMasksEqualsEagerBitForBit) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4_all"}), small_options());
  const int64_t V = gpu->config().vocab;
  const std::vector<int64_t> lens = {10, 17, 24, 13, 9};  // bucket 8: three padding rows
  const int64_t B = int64_t(lens.size());
  Decoding d = prefill(*gpu, lens, 4);
  std::vector<float> raw;
  std::vector<int32_t> raw_greedy;
  StepOutput o0;
  o0.logits = &raw;
  o0.greedy = &raw_greedy;
  gpu->step(d.step({}), o0);
  std::mt19937_64 g(11);
  std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(B));
  for (int64_t r : {0, 2, 3}) masks[size_t(r)] = few_tokens(V, 4, raw_greedy[size_t(r)], g);
  std::vector<float> first_logits;
  std::vector<int32_t> first_greedy;
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(testing::Message() << "graphs " << graphs);
    gpu->set_graphs_enabled(graphs);
    const int64_t replays = gpu->stats().graph_steps;
    StepInput in = d.step({});
    in.token_masks = pointers(masks);
    std::vector<float> logits;
    std::vector<int32_t> greedy;
    StepOutput o;
    o.logits = &logits;
    o.greedy = &greedy;
    gpu->step(in, o);
    EXPECT_EQ(gpu->stats().graph_steps - replays, graphs ? 1 : 0) << "the step ran as intended";
    for (int64_t r = 0; r < B; ++r) {
      if (!masks[size_t(r)].empty()) {
        EXPECT_TRUE(allowed(masks[size_t(r)], greedy[size_t(r)])) << "row " << r;
      } else {
        EXPECT_EQ(greedy[size_t(r)], raw_greedy[size_t(r)]) << "unconstrained row " << r;
      }
    }
    if (first_logits.empty()) {
      first_logits = logits, first_greedy = greedy;
    } else {
      EXPECT_EQ(greedy, first_greedy) << "eager vs graph replay";
      ASSERT_EQ(logits.size(), first_logits.size());
      EXPECT_EQ(std::memcmp(logits.data(), first_logits.data(), logits.size() * 4), 0) << "eager vs graph replay";
    }
    // The next step without masks is unmasked again (graph or eager).
    std::vector<float> after;
    std::vector<int32_t> after_greedy;
    StepOutput o2;
    o2.logits = &after;
    o2.greedy = &after_greedy;
    gpu->step(d.step({}), o2);
    EXPECT_EQ(after_greedy, raw_greedy) << "the slots reset after a masked step";
    EXPECT_EQ(std::memcmp(after.data(), raw.data(), raw.size() * 4), 0) << "unmasked logits after a masked step";
  }
  gpu->set_graphs_enabled(true);
  d.release(*gpu);
}

// Masks filled while the step runs (StepInput::await_token_masks, the engine's overlap): the
// buffers hold all-ones (no mask) until the callback, called once after the forward is enqueued,
// writes the real masks; the step equals the one given its masks up front, bit for bit (logits,
// greedy and sampled tokens), graphs and eager. A runner that read the masks before the callback
// would apply none, and the greedy rows would be the unmasked argmax the masks never allow.
TEST(GpuTokenMasks, MasksFilledDuringTheStepEqualMasksGivenBefore) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(model_dir({"glm5-tiny-sparse", "nvfp4_all"}), small_options());
  const int64_t V = gpu->config().vocab;
  const std::vector<int64_t> lens = {10, 17, 24, 13, 9};
  const int64_t B = int64_t(lens.size());
  Decoding d = prefill(*gpu, lens, 4);
  testing_gpu_runner::SampledRequests q(lens, V, 99);
  std::vector<float> raw;
  std::vector<int32_t> raw_greedy;
  StepOutput o0;
  o0.logits = &raw;
  o0.greedy = &raw_greedy;
  gpu->step(d.step({}), o0);
  std::mt19937_64 g(13);
  std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(B));
  for (int64_t r : {0, 1, 3}) masks[size_t(r)] = few_tokens(V, 5, raw_greedy[size_t(r)], g);
  for (bool graphs : {true, false})
    for (bool sampled_rows : {false, true}) {
      SCOPED_TRACE(testing::Message() << "graphs " << graphs << ", device sampling " << sampled_rows);
      gpu->set_graphs_enabled(graphs);
      auto run = [&](bool late, std::vector<float>& logits, std::vector<int32_t>& greedy,
                     std::vector<GeneratedToken>& sampled) {
        std::vector<std::vector<uint32_t>> buf = masks;  // late: all-ones until the callback
        if (late)
          for (auto& m : buf) std::fill(m.begin(), m.end(), ~0u);
        StepInput in = d.step(sampled_rows ? q.rows() : std::vector<engine::RowSampling>{});
        in.token_masks = pointers(buf);
        int calls = 0;
        if (late)
          in.await_token_masks = [&] {
            ++calls;
            for (size_t r = 0; r < buf.size(); ++r) std::copy(masks[r].begin(), masks[r].end(), buf[r].begin());
          };
        StepOutput o;
        o.logits = &logits;
        o.greedy = &greedy;
        if (sampled_rows) o.sampled = &sampled;
        gpu->step(in, o);
        EXPECT_EQ(calls, late ? 1 : 0);
      };
      std::vector<float> before, during;
      std::vector<int32_t> greedy_before, greedy_during;
      std::vector<GeneratedToken> sampled_before, sampled_during;
      run(false, before, greedy_before, sampled_before);
      run(true, during, greedy_during, sampled_during);
      EXPECT_EQ(greedy_during, greedy_before);
      for (int64_t r : {0, 1, 3}) EXPECT_TRUE(allowed(masks[size_t(r)], greedy_during[size_t(r)])) << "row " << r;
      ASSERT_EQ(during.size(), before.size());
      EXPECT_EQ(std::memcmp(during.data(), before.data(), before.size() * 4), 0) << "masked logits";
      ASSERT_EQ(sampled_during.size(), sampled_before.size());
      for (size_t r = 0; r < sampled_before.size(); ++r) EXPECT_EQ(sampled_during[r].id, sampled_before[r].id) << "row " << r;
    }
  gpu->set_graphs_enabled(true);
  d.release(*gpu);
}

}  // namespace
}  // namespace fp4moe
