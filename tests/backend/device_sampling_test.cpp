// backend/device_sampling: the engine's SampleSpec as the device sampler's row (its
// SamplingParams as given, the draw index, the lists), and the packing of penalty
// histories at one stride (only rows with penalties, prompt then output, + the tokens a K-step
// launch appends). Host code: runs in CI.
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/sampling_params.hpp"
#include "backend/device_sampling.hpp"

namespace fp4moe {
namespace {

using engine::RowSampling;

// The device row is the request's own SamplingParams (no conversion): every knob as given,
// greedy / plain greedy by the struct's one rule (temperature 0 or top_k 1).
TEST(DeviceSampling, TheRowCarriesTheRequestsParamsAsGiven) {
  engine::SamplingParams p;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  p.top_k = 40;
  p.min_p = 0.05f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.25f;
  p.repetition_penalty = 1.2f;
  p.seed = 0x123456789ull;
  p.logprobs_top_n = 5;
  engine::SampleSpec s;
  s.params = &p;
  const cpu::SamplingParams r = engine::row_sampling(s).params;
  EXPECT_EQ(r.temperature, 0.7f);
  EXPECT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.min_p, 0.05f);
  EXPECT_EQ(r.presence_penalty, 0.5f);
  EXPECT_EQ(r.frequency_penalty, -0.25f);
  EXPECT_EQ(r.repetition_penalty, 1.2f);
  EXPECT_EQ(r.seed, 0x123456789ull);
  EXPECT_EQ(r.logprobs_top_n, 5);
  EXPECT_TRUE(r.has_penalties());
  EXPECT_FALSE(engine::plain_greedy(r));
  EXPECT_NO_THROW(cpu::validate_sampling(r));

  cpu::SamplingParams g;  // defaults: temperature 1, top_k -1 (off), no logprobs
  EXPECT_EQ(g.top_k, -1);
  EXPECT_EQ(g.logprobs_top_n, -1);
  EXPECT_FALSE(g.greedy());
  EXPECT_FALSE(g.top_k_on(100));
  g.temperature = 0.0f;
  EXPECT_TRUE(engine::plain_greedy(g));
  g.temperature = 0.8f;
  g.top_k = 1;
  EXPECT_TRUE(g.greedy()) << "top_k 1 is greedy";
  EXPECT_TRUE(engine::plain_greedy(g));
  g.logprobs_top_n = 0;
  EXPECT_FALSE(engine::plain_greedy(g)) << "greedy with logprobs needs the sampler";
  g.logprobs_top_n = -1;
  g.repetition_penalty = 1.1f;
  EXPECT_FALSE(engine::plain_greedy(g)) << "greedy with a penalty needs the sampler";
}

TEST(DeviceSampling, SampleSpecRowKeepsItsDrawIndexAndLists) {
  engine::SamplingParams p;
  p.temperature = 0.5f;
  p.presence_penalty = 0.5f;
  const std::vector<int32_t> prompt = {1, 2, 3}, gen = {4, 5};
  engine::SampleSpec s;
  s.params = &p;
  s.output_index = 2;
  p.logprobs_top_n = 0;
  s.prompt = prompt;
  s.generated = gen;
  const RowSampling r = engine::row_sampling(s);
  EXPECT_EQ(r.draw_index, 2);
  EXPECT_EQ(r.params.logprobs_top_n, 0);
  EXPECT_EQ(r.prompt.data(), prompt.data());
  EXPECT_EQ(r.generated.size(), 2u);
  s.params = nullptr;
  EXPECT_THROW(engine::row_sampling(s), Error);
}

TEST(DeviceSampling, HistoriesPackAtOneStrideForPenalisedRowsOnly) {
  const std::vector<int32_t> pa = {10, 11, 12, 13}, ga = {20}, pb = {30, 31}, gb = {40, 41, 42}, pc = {50, 51, 52, 53, 54, 55};
  std::vector<RowSampling> rows(3);
  rows[0].params.repetition_penalty = 1.5f;  // penalised: 5 tokens
  rows[0].prompt = pa, rows[0].generated = ga, rows[0].draw_index = 1;
  rows[1].params.temperature = 0.7f;         // no penalty: its 9 tokens do not set the stride
  rows[1].prompt = pc, rows[1].generated = gb, rows[1].draw_index = 3;
  rows[2].params.frequency_penalty = 0.5f;   // penalised: 5 tokens
  rows[2].prompt = pb, rows[2].generated = gb, rows[2].draw_index = 7;
  EXPECT_EQ(engine::history_stride(rows, 0), 5);
  EXPECT_EQ(engine::history_stride(rows, 8), 13) << "a K-step launch appends K tokens";
  EXPECT_EQ(engine::history_stride(std::span<const RowSampling>(rows).subspan(1, 1), 8), 0) << "no penalties: none";

  const int64_t stride = engine::history_stride(rows, 2);
  std::vector<int32_t> pl(3, -9), ol(3, -9), draw(3, -9), hist(size_t(3 * stride), -7);
  engine::pack_sampling_rows(rows, stride, pl.data(), ol.data(), draw.data(), hist.data());
  EXPECT_EQ(pl, (std::vector<int32_t>{4, 0, 2}));
  EXPECT_EQ(ol, (std::vector<int32_t>{1, 3, 3}));
  EXPECT_EQ(draw, (std::vector<int32_t>{1, 3, 7}));
  const std::vector<int32_t> want = {10, 11, 12, 13, 20, -7, -7,   // row 0 + 2 free
                                     -7, -7, -7, -7, -7, -7, -7,   // row 1 untouched
                                     30, 31, 40, 41, 42, -7, -7};  // row 2 + 2 free
  EXPECT_EQ(hist, want);

  std::vector<int32_t> small(size_t(3 * 4));
  EXPECT_THROW(engine::pack_sampling_rows(rows, 4, pl.data(), ol.data(), draw.data(), small.data()), Error)
      << "a stride shorter than a penalised row's list";
  rows[1].draw_index = -1;
  EXPECT_THROW(engine::pack_sampling_rows(rows, stride, pl.data(), ol.data(), draw.data(), hist.data()), Error);
}

TEST(DeviceSampling, TokenMasksPackTheConstrainedRowsInOrder) {
  const int64_t W = 3;
  const std::vector<uint32_t> a = {1u, 2u, 3u}, b = {0xffffffffu, 0u, 7u};
  const std::vector<const uint32_t*> masks = {nullptr, a.data(), nullptr, b.data(), a.data()};
  std::vector<int32_t> slot(masks.size(), 99);
  std::vector<uint32_t> packed(size_t(4 * W), 0xdeadu);
  EXPECT_EQ(engine::pack_token_masks(masks, W, 4, slot.data(), packed.data()), 3);
  EXPECT_EQ(slot, (std::vector<int32_t>{-1, 0, -1, 1, 2}));
  EXPECT_EQ(packed, (std::vector<uint32_t>{1u, 2u, 3u, 0xffffffffu, 0u, 7u, 1u, 2u, 3u, 0xdeadu, 0xdeadu, 0xdeadu}))
      << "a row's mask copied whole (the same mask twice gets two slots), the rest untouched";
  const std::vector<const uint32_t*> none = {nullptr, nullptr};
  EXPECT_EQ(engine::pack_token_masks(none, W, 0, slot.data(), packed.data()), 0);
  EXPECT_EQ(slot[0], -1);
  EXPECT_EQ(slot[1], -1);
  EXPECT_THROW(engine::pack_token_masks(masks, W, 2, slot.data(), packed.data()), Error)
      << "more constrained rows than the runner's buffer holds";
}

}  // namespace
}  // namespace fp4moe
