// cpu::quantize_experts_nvfp4 (BF16 routed experts → NVFP4 at load): bytes equal to
// quantize_nvfp4 of each expert's widened rows (owned and view stacks, any thread count), the
// round trip within the format's per-element bound, exact on representable values, refusals.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cpu/expert_quantize.hpp"
#include "format/codecs.hpp"
#include "format/fp4.hpp"

namespace fp4moe {
namespace {

ExpertStack random_bf16_stack(int64_t E, int64_t n, int64_t k, uint32_t seed, float sigma = 0.02f) {
  ExpertStack s;
  s.format = WeightFormat::BF16;
  s.num_experts = E, s.n = n, s.k = k;
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  s.bf16.resize(size_t(E * n * k));
  for (auto& v : s.bf16) v = float_to_bf16(d(rng));
  return s;
}

std::vector<float> widened(const ExpertStack& s, int64_t e) {
  std::vector<float> w(size_t(s.n * s.k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_float(s.expert_bf16(e)[i]);
  return w;
}

TEST(ExpertQuantize, EachExpertIsQuantizeNvfp4OfItsRows) {
  const ExpertStack s = random_bf16_stack(5, 48, 96, 1);
  for (int threads : {1, 2, 4}) {
    const ExpertStack q = cpu::quantize_experts_nvfp4(s, threads);
    ASSERT_EQ(q.format, WeightFormat::NVFP4);
    ASSERT_EQ(q.num_experts, 5);
    for (int64_t e = 0; e < s.num_experts; ++e) {
      const std::vector<float> w = widened(s, e);
      const Fp4Matrix ref = quantize_nvfp4(w.data(), s.n, s.k);
      const Fp4MatrixView got = q.expert(e);
      EXPECT_EQ(got.global_scale, ref.global_scale) << e;
      EXPECT_EQ(0, std::memcmp(got.packed, ref.packed.data(), ref.packed.size())) << e;
      EXPECT_EQ(0, std::memcmp(got.scales, ref.scales.data(), ref.scales.size())) << e;
    }
  }
}

TEST(ExpertQuantize, ViewStackGivesTheOwnedStacksBytes) {
  // w13 as load_moe_layer's view mode holds it: per expert a gate part and an up part.
  const ExpertStack owned = random_bf16_stack(3, 64, 64, 2);
  ExpertStack view = owned;
  view.bf16.clear();
  view.parts = 2;
  std::vector<std::vector<uint16_t>> parts;  // separate allocations, as shards are
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t p = 0; p < 2; ++p)
      parts.emplace_back(owned.expert_bf16(e) + p * 32 * 64, owned.expert_bf16(e) + (p + 1) * 32 * 64);
  for (auto& v : parts) view.views.push_back({nullptr, nullptr, v.data(), 1.0f});
  const ExpertStack a = cpu::quantize_experts_nvfp4(owned, 2), b = cpu::quantize_experts_nvfp4(view, 2);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.global_scale, b.global_scale);  // one global per expert over gate and up together
}

// Per element, with u = e4m3(block scale) · global and v = |x| / u: E2M1's magnitudes
// {0, .5, 1, 1.5, 2, 3, 4, 6} are 0.5 apart below 2, 1 apart in [2, 4) and 2 apart in [4, 6], so
// round-to-nearest errs by at most 0.25 u, 0.5 u and 1 u there; a block max whose scale E4M3
// rounded down (relative step 2^-3, so by at most 2^-4) has v <= 6 · (1 + 2^-4) = 6.375 and is
// clipped to 6: 0.375 u <= 1 u. A slack of 1e-6 relative covers the FP32 division.
TEST(ExpertQuantize, RoundTripIsWithinTheFormatsBound) {
  const ExpertStack s = random_bf16_stack(4, 32, 256, 3);
  const ExpertStack q = cpu::quantize_experts_nvfp4(s, 2);
  double worst = 0;  // the largest error / bound seen: the bound is tight, not loose
  for (int64_t e = 0; e < s.num_experts; ++e) {
    const std::vector<float> w = widened(s, e);
    std::vector<float> out(w.size());
    const Fp4MatrixView m = q.expert(e);
    dequantize_rows(m, 0, s.n, out.data());
    for (size_t i = 0; i < w.size(); ++i) {
      const float u = e4m3_to_float(m.scales[i / 16]) * m.global_scale;
      ASSERT_GT(u, 0.0f) << "block " << i / 16 << " has a zero scale";
      const float v = std::fabs(w[i]) / u;
      const float bound = u * (v < 2.0f ? 0.25f : v < 4.0f ? 0.5f : 1.0f) * (1.0f + 1e-6f);
      const float err = std::fabs(out[i] - w[i]);
      ASSERT_LE(err, bound) << "expert " << e << " element " << i << " x " << w[i] << " got " << out[i];
      worst = std::max(worst, double(err / bound));
    }
  }
  EXPECT_GT(worst, 0.5);  // it really is 4-bit: some element errs by more than half its bound
}

// Values e2m1 · s_b · g with g a power of two, s_b an E4M3 value and a ±6 in every block (and
// the global max 6 · 448 · g): the quantizer recovers g and every s_b exactly (products of
// <= 5 significant bits, exact in FP32 and BF16), so every element comes back bit for bit.
TEST(ExpertQuantize, RepresentableValuesAreExact) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float block_scales[6] = {448.0f, 1.0f, 0.5f, 96.0f, 0.125f, 3.5f};
  const float g = std::ldexp(1.0f, -10);
  ExpertStack s;
  s.format = WeightFormat::BF16;
  s.num_experts = 2, s.n = 6, s.k = 32;
  std::mt19937 rng(4);
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t r = 0; r < s.n; ++r)
      for (int64_t c = 0; c < s.k; ++c) {
        const float sb = block_scales[size_t((r * 2 + c / 16 + e) % 6)];
        float m = c % 16 == 5 ? 6.0f : mags[rng() % 8];
        if (e == 0 && r == 0 && c == 5) m = 6.0f;
        const float x = (rng() % 2 ? -m : m) * sb * g;
        ASSERT_EQ(round_to_bf16(x), x);
        s.bf16.push_back(float_to_bf16(x));
      }
  // The global max: 6 · 448 · g in each expert (block_scales[0] appears in both).
  const ExpertStack q = cpu::quantize_experts_nvfp4(s, 1);
  for (int64_t e = 0; e < 2; ++e) {
    EXPECT_EQ(q.global_scale[size_t(e)], g) << e;
    const std::vector<float> w = widened(s, e);
    std::vector<float> out(w.size());
    dequantize_rows(q.expert(e), 0, s.n, out.data());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(out[i], w[i]) << "expert " << e << " element " << i;
  }
}

TEST(ExpertQuantize, BadStacksAreRefused) {
  ExpertStack fp4 = random_bf16_stack(1, 4, 32, 5);
  fp4.format = WeightFormat::NVFP4;
  EXPECT_THROW(cpu::quantize_experts_nvfp4(fp4, 1), Error);
  EXPECT_THROW(cpu::quantize_experts_nvfp4(random_bf16_stack(1, 4, 24, 5), 1), Error);  // k % 16
  ExpertStack nan = random_bf16_stack(3, 4, 32, 6);
  nan.bf16[size_t(2 * 4 * 32 + 7)] = 0x7FC0;  // NaN in expert 2
  try {
    cpu::quantize_experts_nvfp4(nan, 2);
    FAIL() << "a NaN weight was quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert 2"), std::string::npos) << e.what();
  }
  ExpertStack short_stack = random_bf16_stack(2, 4, 32, 7);
  short_stack.bf16.resize(100);
  EXPECT_THROW(cpu::quantize_experts_nvfp4(short_stack, 1), Error);
}

// Load-time cost: GLM-5's MTP layer has 256 experts of [4096, 6144] + [6144, 2048] (9.7 G
// elements); this prints the rate of one GLM-5 expert pair on this machine's threads.
TEST(ExpertQuantize, Throughput) {
  const ExpertStack w13 = random_bf16_stack(2, 4096, 6144, 8);
  const auto t0 = std::chrono::steady_clock::now();
  const ExpertStack q = cpu::quantize_experts_nvfp4(w13, 2);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double elems = double(w13.num_experts * w13.n * w13.k);
  std::printf("[ perf ] quantize BF16 experts to NVFP4: %.0f Melem/s on 2 threads (GLM-5's MTP experts, 9.66 G "
              "elements: %.0f s at this rate)\n", elems / s / 1e6, 9.66e9 / (elems / s));
  EXPECT_EQ(q.num_experts, 2);
}

}  // namespace
}  // namespace fp4moe
