// linear_cpu over NVFP4 / MXFP4 / BF16 / F32 weight views against a dequantized FP64 reference.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "cpu/linear_cpu.hpp"
#include "format/fp4.hpp"

using namespace fp4moe;

namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(LinearCpu, EveryFormatMatchesItsDequantizedWeightsForEveryTokenCount) {
  const int64_t N = 37, K = 96;
  const auto w = randn(size_t(N * K), 1);
  const Fp4Matrix nv = quantize_nvfp4(w.data(), N, K), mx = quantize_mxfp4(w.data(), N, K);
  std::vector<uint16_t> bf(w.size());
  for (size_t i = 0; i < w.size(); ++i) bf[i] = float_to_bf16(w[i]);
  std::vector<cpu::LinearView> views(4);
  views[0] = {cpu::LinearFormat::NVFP4, N, K, nullptr, nv.packed.data(), nv.scales.data(), nv.global_scale};
  views[1] = {cpu::LinearFormat::MXFP4, N, K, nullptr, mx.packed.data(), mx.scales.data(), 1.0f};
  views[2] = {cpu::LinearFormat::BF16, N, K, bf.data(), nullptr, nullptr, 1.0f};
  views[3] = {cpu::LinearFormat::F32, N, K, w.data(), nullptr, nullptr, 1.0f};
  for (const cpu::LinearView& v : views) {
    std::vector<float> deq(size_t(N * K));
    for (int64_t r = 0; r < N; ++r) cpu::linear_row_cpu(v, r, deq.data() + r * K);
    for (int64_t T : {1, 3, 8, 13}) {
      const auto x = randn(size_t(T * K), uint32_t(T));
      std::vector<float> y(size_t(T * N), NAN);
      cpu::linear_cpu(v, x.data(), T, y.data(), 2);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < N; ++r) {
          double ref = 0;
          for (int64_t k = 0; k < K; ++k) ref += double(x[size_t(t * K + k)]) * deq[size_t(r * K + k)];
          ASSERT_NEAR(y[size_t(t * N + r)], ref, 1e-4 * (1 + std::fabs(ref))) << cpu::linear_format_name(v.format);
        }
    }
    // rows() and the transposed product use the same rows.
    const cpu::LinearView sub = v.rows(5, 9);
    std::vector<float> row(static_cast<size_t>(K));
    cpu::linear_row_cpu(sub, 1, row.data());
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(row[size_t(k)], deq[size_t(6 * K + k)]);
    // Two tokens with strides: coefficients at x[t * 5 + r], outputs at y[t * (K + 3) + k].
    const float coef[10] = {1, -2, 0.5f, 3, 99, -1, 0.25f, 2, -3, 99};
    std::vector<float> acc2(size_t(2 * (K + 3)), 1.0f);
    cpu::linear_t_accumulate_cpu(sub, coef, 5, 2, acc2.data(), K + 3);
    for (int t = 0; t < 2; ++t)
      for (int64_t k = 0; k < K; ++k) {
        double ref = 1.0;
        for (int i = 0; i < 4; ++i) ref += coef[t * 5 + i] * deq[size_t((5 + i) * K + k)];
        ASSERT_NEAR(acc2[size_t(t * (K + 3) + k)], ref, 1e-4 * (1 + std::fabs(ref)));
      }
    // Strided rows through linear_strided_cpu equal the packed call.
    const auto xs = randn(size_t(3 * (K + 7)), 9);
    std::vector<float> ys(size_t(3 * (N + 2)), NAN), yp(size_t(3 * N));
    std::vector<float> xp(size_t(3 * K));
    for (int t = 0; t < 3; ++t) std::copy(xs.begin() + t * (K + 7), xs.begin() + t * (K + 7) + K, xp.begin() + t * K);
    cpu::linear_strided_cpu(v, xs.data(), K + 7, 3, ys.data(), N + 2, 2);
    cpu::linear_cpu(v, xp.data(), 3, yp.data(), 2);
    for (int t = 0; t < 3; ++t)
      for (int64_t r = 0; r < N; ++r) ASSERT_EQ(ys[size_t(t * (N + 2) + r)], yp[size_t(t * N + r)]);
  }
  const std::vector<float> dq_ref = [&] {
    std::vector<float> d(size_t(N * K));
    dequantize_rows(nv.view(), 0, N, d.data());
    return d;
  }();
  std::vector<float> row(static_cast<size_t>(K));
  cpu::linear_row_cpu(views[0], 3, row.data());
  for (int64_t k = 0; k < K; ++k) ASSERT_EQ(row[size_t(k)], dq_ref[size_t(3 * K + k)]);
}
