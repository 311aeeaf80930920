// Shared-expert folding (moe/shared_fold.hpp), host side (no GPU): when a shared expert is
// foldable, and that its n_sh pieces are exact slices whose MLPs sum to the full shared MLP.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "format/fp4.hpp"
#include "moe/random_layer.hpp"
#include "moe/shared_fold.hpp"

namespace fp4moe {
namespace {

MoeConfig small_cfg(int64_t shared_inter) {
  MoeConfig c;
  c.hidden = 64;
  c.inter = 32;
  c.num_experts = 4;
  c.top_k = 2;
  c.shared_inter = shared_inter;
  return c;
}

std::vector<float> dequant(const ExpertStack& s, int64_t e) {
  std::vector<float> out(size_t(s.n * s.k));
  dequantize_rows(s.expert(e), 0, s.n, out.data());
  return out;
}

// y = down · (SiLU(gate · x) * (up · x)), dense float weights [2I, H] and [H, I].
std::vector<double> mlp(const std::vector<float>& gu, const std::vector<float>& dn, int64_t I, int64_t H,
                        const std::vector<float>& x) {
  std::vector<double> h(static_cast<size_t>(I)), y(static_cast<size_t>(H), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t j = 0; j < H; ++j) {
      g += double(gu[size_t(i * H + j)]) * x[size_t(j)];
      u += double(gu[size_t((I + i) * H + j)]) * x[size_t(j)];
    }
    h[size_t(i)] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t r = 0; r < H; ++r)
    for (int64_t i = 0; i < I; ++i) y[size_t(r)] += double(dn[size_t(r * I + i)]) * h[size_t(i)];
  return y;
}

TEST(SharedFold, WhenFoldable) {
  std::string why;
  EXPECT_EQ(moe::shared_fold_pieces(moe::random_moe_layer(small_cfg(32), 1), 8, &why), 1);
  EXPECT_EQ(moe::shared_fold_pieces(moe::random_moe_layer(small_cfg(96), 1), 8, &why), 3);
  EXPECT_EQ(moe::shared_fold_pieces(moe::random_moe_layer(small_cfg(96), 1), 2, &why), 0);
  EXPECT_NE(why.find("maximum"), std::string::npos) << why;
  EXPECT_EQ(moe::shared_fold_pieces(moe::random_moe_layer(small_cfg(48), 1), 8, &why), 0);
  EXPECT_NE(why.find("multiple"), std::string::npos) << why;
  EXPECT_EQ(moe::shared_fold_pieces(moe::random_moe_layer(small_cfg(0), 1), 8, &why), 0);
  MoeLayerWeights mixed = moe::random_moe_layer(small_cfg(32), 1);
  const MoeLayerWeights mx = moe::random_moe_layer(small_cfg(32), 2, WeightFormat::MXFP4);
  mixed.shared_w13 = mx.shared_w13;
  mixed.shared_w2 = mx.shared_w2;
  EXPECT_EQ(moe::shared_fold_pieces(mixed, 8, &why), 0);
  EXPECT_NE(why.find("mxfp4"), std::string::npos) << why;
}

TEST(SharedFold, PiecesAreSlicesAndSumToTheSharedMlp) {
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4})
    for (int64_t n_sh : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << weight_format_name(f) << " n_sh " << n_sh);
      const MoeConfig c = small_cfg(32 * n_sh);
      const MoeLayerWeights w = moe::random_moe_layer(c, 10 + n_sh, f);
      ASSERT_EQ(moe::shared_fold_pieces(w, 8), n_sh);
      const moe::SharedPieces p = moe::split_shared_expert(w, n_sh);
      const int64_t H = c.hidden, I = c.inter, SI = c.shared_inter;
      ASSERT_EQ(p.w13.num_experts, n_sh);
      ASSERT_EQ(p.w13.n, 2 * I);
      ASSERT_EQ(p.w13.k, H);
      ASSERT_EQ(p.w2.num_experts, n_sh);
      ASSERT_EQ(p.w2.n, H);
      ASSERT_EQ(p.w2.k, I);
      const std::vector<float> gu = dequant(*w.shared_w13, 0), dn = dequant(*w.shared_w2, 0);
      std::vector<float> x(static_cast<size_t>(H));
      for (int64_t j = 0; j < H; ++j) x[size_t(j)] = float(std::sin(0.37 * double(j)));
      const std::vector<double> full = mlp(gu, dn, SI, H, x);
      std::vector<double> sum(size_t(H), 0.0);
      for (int64_t j = 0; j < n_sh; ++j) {
        const std::vector<float> pg = dequant(p.w13, j), pd = dequant(p.w2, j);
        for (int64_t r = 0; r < I; ++r)
          for (int64_t col = 0; col < H; ++col) {
            ASSERT_EQ(pg[size_t(r * H + col)], gu[size_t((j * I + r) * H + col)]) << "gate " << j << "," << r;
            ASSERT_EQ(pg[size_t((I + r) * H + col)], gu[size_t((SI + j * I + r) * H + col)]) << "up " << j << "," << r;
          }
        for (int64_t r = 0; r < H; ++r)
          for (int64_t i = 0; i < I; ++i)
            ASSERT_EQ(pd[size_t(r * I + i)], dn[size_t(r * SI + j * I + i)]) << "down " << j << "," << r;
        const std::vector<double> y = mlp(pg, pd, I, H, x);
        for (int64_t r = 0; r < H; ++r) sum[size_t(r)] += y[size_t(r)];
      }
      for (int64_t r = 0; r < H; ++r) EXPECT_NEAR(sum[size_t(r)], full[size_t(r)], 1e-9 * (1 + std::fabs(full[size_t(r)])));
    }
}

}  // namespace
}  // namespace fp4moe
