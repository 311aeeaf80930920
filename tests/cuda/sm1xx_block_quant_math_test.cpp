// The activation quantizer's per-block arithmetic (cuda/moe_gemm_sm1xx/nvfp4_block_quant.hpp,
// the very function the device kernel calls) run on the host, against the CPU reference
// quantizer format/fp4.cpp (quantize_nvfp4 with a static global) and codecs.cpp's E2M1 / E4M3
// encoders: every code and every scale. No GPU needed. (On sm_89+ the device rounds to E4M3
// with the hardware cvt, the host with cuda_fp8.h's software path: the GPU test
// nvfp4_act_quant_test covers that half.)
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/moe_gemm_sm1xx/nvfp4_block_quant.hpp"
#include "format/codecs.hpp"
#include "format/fp4.hpp"

using namespace fp4moe;
using namespace fp4moe::cuda::sm1xx;

namespace {

// Compares one block with the CPU quantizer; returns false (with a message) on the first difference.
::testing::AssertionResult same_as_cpu(const float (&v)[16], float g) {
  const Fp4Matrix ref = quantize_nvfp4(v, 1, 16, g);
  const Nvfp4Block b = quantize_block16(v, g);
  if (b.sf != ref.scales[0])
    return ::testing::AssertionFailure() << "scale " << int(b.sf) << " vs CPU " << int(ref.scales[0]) << " (g " << g << ")";
  for (int j = 0; j < 8; ++j) {
    const uint32_t word = j < 4 ? b.lo : b.hi;
    const uint8_t byte = uint8_t(word >> (8 * (j % 4)));
    if (byte != ref.packed[size_t(j)])
      return ::testing::AssertionFailure() << "byte " << j << " " << int(byte) << " vs CPU " << int(ref.packed[size_t(j)])
                                           << " (elements " << 2 * j << ", " << 2 * j + 1 << ": " << v[2 * j] << ", "
                                           << v[2 * j + 1] << "; g " << g << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(Sm1xxBlockQuantMath, E2m1CodeMatchesTheCpuEncoderOnEveryBoundaryAndBetween) {
  // The grid points, the midpoints (ties to even), their float neighbours, and a sweep.
  std::vector<float> xs = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 1e30f, 1e-30f};
  for (float x : std::vector<float>(xs)) {
    xs.push_back(std::nextafter(x, 0.0f));
    xs.push_back(std::nextafter(x, 100.0f));
  }
  for (int i = -4000; i <= 4000; ++i) xs.push_back(float(i) * 0.00173f);
  for (float x : xs) {
    EXPECT_EQ(e2m1_code(x), uint32_t(e2m1_from_float_nvfp4(x))) << x;
    if (x != 0.0f) {
      EXPECT_EQ(e2m1_code(-x), uint32_t(e2m1_from_float_nvfp4(-x))) << -x;
    }
  }
  EXPECT_EQ(e2m1_code(std::nanf("")), 7u);
}

TEST(Sm1xxBlockQuantMath, RandomBlocksMatchTheCpuQuantizerEveryCodeAndScale) {
  std::mt19937 rng(19);
  int blocks = 0;
  for (float amax_tensor : {1e-3f, 0.37f, 2.5f, 48.0f, 3000.0f}) {
    const float g = nvfp4_global_scale_from_amax(amax_tensor);
    for (int t = 0; t < 2000; ++t) {
      // Block magnitudes from far below to above the tensor's amax (saturating codes).
      const float mag = amax_tensor * std::ldexp(1.0f, int(rng() % 24) - 20) * (1.0f + float(rng() % 1000) / 1000.0f);
      std::uniform_real_distribution<float> d(-mag, mag);
      float v[16];
      for (float& x : v) x = d(rng);
      if (t % 7 == 0) v[rng() % 16] = 0.0f;
      ASSERT_TRUE(same_as_cpu(v, g)) << "tensor amax " << amax_tensor << " block " << t;
      ++blocks;
    }
  }
  EXPECT_EQ(blocks, 10000);
}

TEST(Sm1xxBlockQuantMath, EdgeBlocksMatchTheCpuQuantizer) {
  const float g = nvfp4_global_scale_from_amax(2.5f);
  float zeros[16] = {};
  EXPECT_TRUE(same_as_cpu(zeros, g));  // all zero: scale 1.0 (s = 0 -> 1), codes 0
  EXPECT_EQ(quantize_block16(zeros, g).sf, 0x38);
  float tiny[16];
  for (int i = 0; i < 16; ++i) tiny[i] = (i % 2 ? -1.0f : 1.0f) * 1e-12f * float(i + 1);
  EXPECT_TRUE(same_as_cpu(tiny, g));  // s clamped up to 2^-9
  float huge[16];
  for (int i = 0; i < 16; ++i) huge[i] = 1e6f * float(i - 8);
  EXPECT_TRUE(same_as_cpu(huge, g));  // s clamped to 448: codes saturate at 6
  EXPECT_EQ(quantize_block16(huge, g).sf, e4m3_from_float(448.0f));
  // Exact E2M1 ties after the scale (a power-of-two global keeps every product exact): amax
  // 24 g gives s = 4, and x / (4 g) lands on the midpoints 0.75 / 1.75 / 3.5 (ties to even).
  const float gp = 0.0625f;
  float ties[16] = {6.0f, 0.75f, 1.75f, 3.5f, 2.5f, 5.0f, 0.25f, 1.25f, -0.75f, -1.75f, -3.5f, -2.5f, -5.0f, -0.25f, -1.25f, -6.0f};
  for (float& x : ties) x *= gp * 4.0f;
  EXPECT_TRUE(same_as_cpu(ties, gp));
  const Nvfp4Block tb = quantize_block16(ties, gp);
  EXPECT_EQ(tb.sf, e4m3_from_float(4.0f));
  EXPECT_EQ(tb.lo & 0xF, 7u);           // 6 -> code 7
  EXPECT_EQ((tb.lo >> 4) & 0xF, 2u);    // 0.75 -> 1.0 (even) = code 2
  EXPECT_EQ((tb.lo >> 8) & 0xF, 4u);    // 1.75 -> 2.0 = code 4
  EXPECT_EQ((tb.lo >> 12) & 0xF, 6u);   // 3.5 -> 4.0 = code 6
  // A zero global (an all-zero tensor): scale 1.0, codes 0, whatever the block holds.
  const Nvfp4Block z = quantize_block16(ties, 0.0f);
  EXPECT_EQ(z.sf, 0x38);
  EXPECT_EQ(z.lo | z.hi, 0u);
}
