// cuda/linear's host side, no GPU: which kernel each linear gets (choose_linear_kernel) and the
// reasons can_implement gives, for the shapes GLM-5 has (incl. those that fall back), and the
// load-time BF16 conversion (linear_to_bf16) against an independent decode of the FP4 codes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cuda/linear/linear.hpp"
#include "cuda/linear_fp4_gemm_check.hpp"
#include "format/codecs.hpp"

namespace fp4moe::test {
namespace {

using cpu::LinearFormat;
using cuda::linear::LinearChoice;
using cuda::linear::LinearDesc;
using cuda::linear::LinearKernel;

LinearDesc desc(LinearFormat f, int64_t n, int64_t k, int64_t max_tokens = 256, bool bf16_only = false) {
  LinearDesc d;
  d.format = f;
  d.n = n;
  d.k = k;
  d.max_tokens = max_tokens;
  d.bf16_only = bf16_only;
  return d;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

#ifdef FP4MOE_HAVE_SM90
constexpr bool kSm90Built = true;
#else
constexpr bool kSm90Built = false;
#endif

TEST(LinearChoice, Fp4OnSm90TakesTheSm90KernelsWhereTheTilesFit) {
  // GLM-5's q_b_proj [16384 x 2048], o_proj [6144 x 16384], dense MLP [12288 x 6144], MXFP4 too.
  for (LinearFormat f : {LinearFormat::NVFP4, LinearFormat::MXFP4})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{16384, 2048}, {6144, 16384}, {12288, 6144}, {128, 64}}) {
      const LinearChoice c = cuda::linear::choose_linear_kernel(desc(f, n, k, 4096), 90);
      SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(k));
      EXPECT_FALSE(c.converted);
      if (kSm90Built) {
        EXPECT_EQ(c.kernel, LinearKernel::Fp4Sm90) << c.why;
        EXPECT_EQ(c.why, "");
      } else {
        EXPECT_EQ(c.kernel, LinearKernel::Fp4Generic);
        EXPECT_TRUE(has(c.why, "was not compiled")) << c.why;
      }
    }
}

TEST(LinearChoice, Fp4ShapesOffTheSm90TilesRunGenericAndSayWhy) {
  if (!kSm90Built) GTEST_SKIP() << "this build has no sm_90a kernels: every FP4 linear is Generic";
  // kv_a_proj_with_mqa [576 x 6144]: N not a multiple of the 128-row tile.
  LinearChoice c = cuda::linear::choose_linear_kernel(desc(LinearFormat::NVFP4, 576, 6144), 90);
  EXPECT_EQ(c.kernel, LinearKernel::Fp4Generic);
  EXPECT_FALSE(c.converted);
  EXPECT_TRUE(has(c.why, "N = 576 is not a positive multiple of 128")) << c.why;
  // K = 96: a multiple of MXFP4's 32-block, not of the sm90 64-wide K stage.
  c = cuda::linear::choose_linear_kernel(desc(LinearFormat::MXFP4, 256, 96), 90);
  EXPECT_EQ(c.kernel, LinearKernel::Fp4Generic);
  EXPECT_TRUE(has(c.why, "K = 96 is not a positive multiple of 64")) << c.why;
  // Another GPU: the sm90 kernels need sm_90a; Generic runs anywhere.
  for (int sm : {80, 89, 100, 120}) {
    c = cuda::linear::choose_linear_kernel(desc(LinearFormat::NVFP4, 2048, 6144), sm);
    EXPECT_EQ(c.kernel, LinearKernel::Fp4Generic) << sm;
    EXPECT_TRUE(has(c.why, "needs sm_90a") && has(c.why, "sm_" + std::to_string(sm))) << c.why;
  }
}

TEST(LinearChoice, Fp4NoKernelTakesIsDequantizedAtLoadWithBothReasons) {
  // K = 24: not a multiple of NVFP4's 16-block, so neither FP4 kernel takes it.
  const LinearChoice c = cuda::linear::choose_linear_kernel(desc(LinearFormat::NVFP4, 256, 24), 90);
  EXPECT_EQ(c.kernel, LinearKernel::Bf16Cublaslt);
  EXPECT_TRUE(c.converted);
  EXPECT_TRUE(has(c.why, "no FP4 kernel takes it")) << c.why;
  EXPECT_TRUE(has(c.why, "fp4 sm90: ") && has(c.why, "fp4 generic: K=24 is not a multiple of the nvfp4 block size 16"))
      << c.why;
}

TEST(LinearChoice, Bf16OnlyCallersGetTheBf16Form) {
  // kv_b_proj (absorbed per head) and lm_head (FP32 logits of the sampled rows) need cuBLASLt.
  for (LinearFormat f : {LinearFormat::NVFP4, LinearFormat::MXFP4}) {
    const LinearDesc d = desc(f, 32768, 512, 256, true);
    const LinearChoice c = cuda::linear::choose_linear_kernel(d, 90);
    EXPECT_EQ(c.kernel, LinearKernel::Bf16Cublaslt);
    EXPECT_TRUE(c.converted);
    EXPECT_EQ(c.why, "the caller needs the BF16 form");
    for (LinearKernel k : {LinearKernel::Fp4Sm90, LinearKernel::Fp4Generic})
      EXPECT_TRUE(has(cuda::linear::can_implement(k, d, 90), "the caller needs the BF16 form"));
  }
}

TEST(LinearChoice, Bf16AndF32WeightsRunCublasLt) {
  LinearChoice c = cuda::linear::choose_linear_kernel(desc(LinearFormat::BF16, 154880, 6144), 90);
  EXPECT_EQ(c.kernel, LinearKernel::Bf16Cublaslt);
  EXPECT_FALSE(c.converted);
  EXPECT_EQ(c.why, "");
  c = cuda::linear::choose_linear_kernel(desc(LinearFormat::F32, 576, 6144), 90);
  EXPECT_EQ(c.kernel, LinearKernel::Bf16Cublaslt);
  EXPECT_TRUE(c.converted);
  EXPECT_TRUE(has(c.why, "no F32 kernel")) << c.why;
  for (LinearFormat f : {LinearFormat::BF16, LinearFormat::F32}) {
    const LinearDesc d = desc(f, 256, 256);
    EXPECT_EQ(cuda::linear::can_implement(LinearKernel::Bf16Cublaslt, d, 90), "");
    for (LinearKernel k : {LinearKernel::Fp4Sm90, LinearKernel::Fp4Generic})
      EXPECT_TRUE(has(cuda::linear::can_implement(k, d, 90), "takes NVFP4 or MXFP4 weights, not " +
                                                                 std::string(cpu::linear_format_name(f))));
  }
}

TEST(LinearChoice, BadShapesAreRefusedWithOneLine) {
  for (const LinearDesc& d : {desc(LinearFormat::BF16, 0, 64), desc(LinearFormat::NVFP4, 64, -16),
                              desc(LinearFormat::NVFP4, 128, 64, 0), desc(LinearFormat::BF16, int64_t(1) << 31, 64)}) {
    EXPECT_THROW(cuda::linear::choose_linear_kernel(d, 90), Error);
    EXPECT_NE(cuda::linear::can_implement(LinearKernel::Bf16Cublaslt, d, 90), "");
  }
  EXPECT_TRUE(has(cuda::dense_fp4_can_implement(cuda::DenseFp4Kernel::Generic, WeightFormat::BF16, 128, 64, 8, 90),
                  "takes NVFP4 or MXFP4 weights, not bf16"));
}

TEST(LinearChoice, KernelNamesAreDistinct) {
  EXPECT_STREQ(cuda::linear::linear_kernel_name(LinearKernel::Fp4Sm90), "fp4 sm90");
  EXPECT_STREQ(cuda::linear::linear_kernel_name(LinearKernel::Fp4Generic), "fp4 generic");
  EXPECT_STREQ(cuda::linear::linear_kernel_name(LinearKernel::Bf16Cublaslt), "bf16 cublaslt");
  EXPECT_STREQ(cuda::dense_fp4_kernel_name(cuda::DenseFp4Kernel::Sm90), "sm90");
  EXPECT_STREQ(cuda::dense_fp4_kernel_name(cuda::DenseFp4Kernel::Generic), "generic");
}

// linear_to_bf16 (the fallback's load-time copy): each FP4 element is code × (block scale ×
// global), decoded here from the codec tables, then rounded once to BF16; F32 rounded; BF16 as is.
TEST(LinearToBf16, MatchesAnIndependentDecode) {
  std::mt19937_64 rng(7);
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4}) {
    const int n = 5, k = 96;
    const ExpertStack s = random_expert_stack(f, 1, n, k, rng);
    cpu::LinearView v;
    v.format = f == WeightFormat::MXFP4 ? LinearFormat::MXFP4 : LinearFormat::NVFP4;
    v.n = n;
    v.k = k;
    v.packed = s.packed.data();
    v.scales = s.scales.data();
    v.global_scale = s.global_scale[0];
    const std::vector<uint16_t> got = cuda::linear::linear_to_bf16(v);
    ASSERT_EQ(got.size(), size_t(n * k));
    const int block = int(s.block());
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < k; ++i) {
        const uint8_t byte = s.packed[size_t(r * (k / 2) + i / 2)];
        const float code = e2m1_to_float(i % 2 ? uint8_t(byte >> 4) : uint8_t(byte & 0xF));
        const uint8_t sc = s.scales[size_t(r * (k / block) + i / block)];
        const float scale = f == WeightFormat::MXFP4 ? e8m0_to_float(sc) : e4m3_to_float(sc);
        const float want = code * (scale * v.global_scale);  // the block multiplier first, as format/fp4 does
        ASSERT_EQ(got[size_t(r * k + i)], float_to_bf16(want)) << weight_format_name(f) << " row " << r << " col " << i;
      }
  }
  const std::vector<float> f32 = {1.0f, -3.3f, 1e-3f, 65504.0f, 0.0f, -0.1f};
  cpu::LinearView v;
  v.format = LinearFormat::F32;
  v.n = 2;
  v.k = 3;
  v.data = f32.data();
  const std::vector<uint16_t> got = cuda::linear::linear_to_bf16(v);
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(got[i], float_to_bf16(f32[i]));
  std::vector<uint16_t> b16 = {1, 2, 0x7f80, 0x3f80, 0xbf80, 7};
  v.format = LinearFormat::BF16;
  v.data = b16.data();
  EXPECT_EQ(cuda::linear::linear_to_bf16(v), b16);
}

// Host cost of the load-time work (run with --gtest_also_run_disabled_tests; numbers in
// cuda/linear/README.md): the choice per linear, and the BF16 copy of a weight that falls back.
TEST(LinearToBf16, DISABLED_TimeChoiceAndConversion) {
  using clock = std::chrono::steady_clock;
  const LinearDesc d = desc(LinearFormat::NVFP4, 16384, 2048, 4096);  // sm90: 13 buckets checked
  auto t0 = clock::now();
  const int reps = 2000;
  for (int i = 0; i < reps; ++i) ASSERT_EQ(cuda::linear::choose_linear_kernel(d, 90).converted, false);
  const double choice_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / reps;
  std::mt19937_64 rng(1);
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4}) {
    const int n = 16384, k = 2048;  // GLM-5's q_b_proj
    const ExpertStack s = random_expert_stack(f, 1, n, k, rng);
    cpu::LinearView v;
    v.format = f == WeightFormat::MXFP4 ? LinearFormat::MXFP4 : LinearFormat::NVFP4;
    v.n = n;
    v.k = k;
    v.packed = s.packed.data();
    v.scales = s.scales.data();
    v.global_scale = s.global_scale[0];
    t0 = clock::now();
    const std::vector<uint16_t> b = cuda::linear::linear_to_bf16(v);
    const double sec = std::chrono::duration<double>(clock::now() - t0).count();
    std::printf("choose_linear_kernel: %.2f us per linear; linear_to_bf16 %s [%d x %d]: %.3f s, %.2f GB/s of BF16 out "
                "(%.2f GB/s of FP4 in)\n",
                choice_us, weight_format_name(f).data(), n, k, sec, double(b.size()) * 2 / sec / 1e9,
                double(s.weight_bytes_per_expert()) / sec / 1e9);
  }
}

}  // namespace
}  // namespace fp4moe::test
