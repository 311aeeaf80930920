// The CPU reference of a grouped expert GEMM (cpu/grouped_gemm_ref.hpp) against a plain
// dequantize-then-multiply on tiny random data, every epilogue, both formats and the W4A4
// fake-quant; the row sampler; and the per-row comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/bf16.hpp"
#include "cpu/grouped_gemm_ref.hpp"
#include "format/fp4.hpp"
#include "random_fp4.hpp"

namespace fp4moe {
namespace {

TEST(GroupedGemmRef, MatchesDequantizeThenMultiply) {
  const int64_t E = 3, N = 8, K = 64;
  const std::vector<int32_t> off = {0, 2, 2, 5};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> x(5 * K);
  for (auto& v : x) v = float_to_bf16(nd(rng));
  const std::vector<float> rs = {0.5f, 1.5f, 2.0f, 0.25f, 1.0f};
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4})
    for (Epilogue ep : {Epilogue::None, Epilogue::SiluMul, Epilogue::RowScale}) {
      const ExpertStack w = test::random_stack(f, E, N, K, 9);
      GroupedGemmRef r;
      r.w = &w;
      r.x = x.data();
      r.m_total = 5;
      r.offsets = off.data();
      r.row_scale = rs.data();
      r.epilogue = ep;
      const std::vector<double> got = grouped_gemm_reference(r, {4, 0, 3}, 1);
      const int64_t cols = reference_cols(r);
      ASSERT_EQ(got.size(), size_t(3 * cols));
      const int64_t rows[3] = {4, 0, 3}, experts[3] = {2, 0, 2};
      for (int i = 0; i < 3; ++i) {
        std::vector<float> wf(size_t(N * K));
        dequantize_rows(w.expert(experts[i]), 0, N, wf.data());
        std::vector<double> acc(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) acc[size_t(n)] += double(bf16_to_float(x[size_t(rows[i] * K + k)])) * wf[size_t(n * K + k)];
        for (int64_t j = 0; j < cols; ++j) {
          double want = acc[size_t(j)];
          if (ep == Epilogue::SiluMul) want = want / (1 + std::exp(-want)) * acc[size_t(N / 2 + j)];
          if (ep == Epilogue::RowScale) want *= rs[size_t(rows[i])];
          EXPECT_NEAR(got[size_t(i * cols + j)], want, 1e-9 * (1 + std::fabs(want))) << i << " " << j;
        }
      }
    }
}

TEST(GroupedGemmRef, Nvfp4ActivationsAreFakeQuantizedWithTheTensorGlobal) {
  const int64_t N = 4, K = 32;
  const ExpertStack w = test::random_stack(WeightFormat::NVFP4, 1, N, K, 3);
  std::vector<uint16_t> x(2 * K);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(float(int(i % 13) - 6) * 0.37f);
  const std::vector<int32_t> off = {0, 2};
  GroupedGemmRef r;
  r.w = &w;
  r.x = x.data();
  r.m_total = 2;
  r.offsets = off.data();
  r.nvfp4_act = true;
  const std::vector<double> q = grouped_gemm_reference(r, {0, 1}, 1);
  r.nvfp4_act = false;
  const std::vector<double> plain = grouped_gemm_reference(r, {0, 1}, 1);
  // Different (4-bit activations), but close: the same function.
  double num = 0, den = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    num += (q[i] - plain[i]) * (q[i] - plain[i]);
    den += plain[i] * plain[i];
  }
  EXPECT_GT(num, 0.0);
  EXPECT_LT(std::sqrt(num / den), 0.3);
}

TEST(GroupedGemmRef, SampleRowsCoversExpertEdgesAndStaysInRange) {
  const std::vector<int32_t> off = {0, 10, 10, 11, 300, 1000};
  const std::vector<int64_t> all = sample_rows(off.data(), 5, 5000);
  EXPECT_EQ(all.size(), 1000u);
  const std::vector<int64_t> some = sample_rows(off.data(), 5, 16);
  EXPECT_LE(some.size(), 16u);
  for (size_t i = 1; i < some.size(); ++i) EXPECT_LT(some[i - 1], some[i]);
  for (int64_t m : some) EXPECT_LT(m, 1000);
  for (int64_t edge : {0, 9, 10, 299, 999})  // first / last rows of the 4 experts with rows
    EXPECT_NE(std::find(some.begin(), some.end(), edge), some.end()) << edge;
  EXPECT_TRUE(sample_rows(off.data(), 5, 0).empty());
}

TEST(GroupedGemmRef, CompareRowsFindsTheWorstRow) {
  const std::vector<double> ref = {1, 1, 1, 1, 2, 2};
  std::vector<float> got = {1, 1, 1, 1.05f, 2, 2};
  RowErrors e = compare_rows(got, ref, 2, 1e-2);
  EXPECT_EQ(e.bad_rows, 1);
  EXPECT_EQ(e.worst_row, 1);
  EXPECT_NEAR(e.worst, 0.05 / std::sqrt(2.0), 1e-6);
  got[0] = NAN;
  e = compare_rows(got, ref, 2, 1e-2);
  EXPECT_EQ(e.bad_rows, 2);
  EXPECT_TRUE(std::isinf(e.worst));
  EXPECT_EQ(e.worst_row, 0);
}

}  // namespace
}  // namespace fp4moe
