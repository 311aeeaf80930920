// Permutation, gather and combine vs simple CPU references: offsets = exclusive scan of
// the per-expert counts; inside an expert rows ordered by (token, slot); the two maps
// inverse of each other; gather copies rows bit-exactly; combine sums in slot order.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cuda/permute/permute.hpp"
#include "moe_test_util.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;

enum class Pattern { Random, Hot, Cold };

std::vector<int32_t> make_ids(int T, int k, int E, Pattern p, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> ids(size_t(T) * k);
  for (int t = 0; t < T; ++t) {
    // k distinct experts per token, as a router gives.
    std::vector<int32_t> perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    for (int s = 0; s < k; ++s) {
      std::swap(perm[size_t(s)], perm[size_t(s) + g() % size_t(E - s)]);
      int32_t e = perm[size_t(s)];
      if (p == Pattern::Hot) e = s == 0 ? 3 % E : e;                 // every token hits expert 3
      if (p == Pattern::Cold) e = e % std::max(1, E / 4) * 4 % E;    // only multiples of 4 get tokens
      ids[size_t(t) * k + s] = e;
    }
  }
  return ids;
}

struct PermCase { int T, k, E; Pattern p; };

class PermuteTest : public ::testing::TestWithParam<PermCase> {};

TEST_P(PermuteTest, OffsetsOrderAndMaps) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const auto [T, k, E, pattern] = GetParam();
  const int P = T * k;
  const auto ids = make_ids(T, k, E, pattern, 1234 + T);
  const auto w = test::random_floats(size_t(P), 7, 0.f, 1.f);
  DeviceArray<int32_t> d_ids(ids), d_off(size_t(E + 1)), d_row_pair(static_cast<size_t>(P)), d_pair_row(static_cast<size_t>(P));
  DeviceArray<float> d_w(w), d_row_w(static_cast<size_t>(P));
  DeviceArray<uint8_t> scratch(cuda::permute_scratch_bytes(P, E));
  cuda::PermuteArgs a;
  a.topk_ids = d_ids.ptr;
  a.topk_weights = d_w.ptr;
  a.tokens = T;
  a.top_k = k;
  a.num_experts = E;
  a.expert_offsets = d_off.ptr;
  a.row_pair = d_row_pair.ptr;
  a.pair_row = d_pair_row.ptr;
  a.row_weight = d_row_w.ptr;
  a.scratch = scratch.ptr;
  cuda::build_permutation(a, nullptr);
  const auto off = d_off.download();
  const auto row_pair = d_row_pair.download();
  const auto pair_row = d_pair_row.download();
  const auto row_w = d_row_w.download();

  // Reference: stable sort of pair indices by expert.
  std::vector<int32_t> ref_rows(static_cast<size_t>(P));
  std::iota(ref_rows.begin(), ref_rows.end(), 0);
  std::stable_sort(ref_rows.begin(), ref_rows.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  std::vector<int32_t> ref_off(size_t(E + 1), 0);
  for (int32_t e : ids) ref_off[size_t(e) + 1]++;
  for (int e = 0; e < E; ++e) ref_off[size_t(e) + 1] += ref_off[size_t(e)];
  ASSERT_EQ(off, ref_off);
  ASSERT_EQ(row_pair, ref_rows);
  for (int p = 0; p < P; ++p) {
    ASSERT_EQ(row_pair[size_t(pair_row[size_t(p)])], p);
    ASSERT_EQ(row_w[size_t(pair_row[size_t(p)])], w[size_t(p)]);
  }
  if (pattern == Pattern::Hot) {
    EXPECT_GE(off[4] - off[3], T);
  }
  if (pattern == Pattern::Cold && E >= 8) {
    EXPECT_EQ(off[2], off[1]);  // expert 1 has no tokens
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PermuteTest,
                         ::testing::Values(PermCase{1, 8, 256, Pattern::Random}, PermCase{7, 2, 8, Pattern::Random},
                                           PermCase{1000, 8, 256, Pattern::Random},
                                           PermCase{4097, 8, 256, Pattern::Random},
                                           PermCase{4097, 8, 256, Pattern::Hot},
                                           PermCase{1000, 8, 256, Pattern::Cold},
                                           PermCase{513, 1, 16, Pattern::Hot},
                                           PermCase{300, 6, 1000, Pattern::Random}));

TEST(Permute, GatherAndCombine) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int T = 1001, k = 8, H = 264, P = T * k;
  std::vector<int32_t> row_pair(static_cast<size_t>(P));
  std::iota(row_pair.begin(), row_pair.end(), 0);
  std::shuffle(row_pair.begin(), row_pair.end(), std::mt19937_64(5));
  std::vector<int32_t> pair_row(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) pair_row[size_t(row_pair[size_t(r)])] = r;
  auto to_bf16 = [](const std::vector<float>& f) {
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
    return b;
  };
  const auto x = to_bf16(test::random_floats(size_t(T) * H, 1));
  const auto y = to_bf16(test::random_floats(size_t(P) * H, 2));
  const auto sh = to_bf16(test::random_floats(size_t(T) * H, 3));
  DeviceArray<uint16_t> d_x(x), d_y(y), d_sh(sh), d_xp(size_t(P) * H), d_ob(size_t(T) * H);
  DeviceArray<int32_t> d_rp(row_pair), d_pr(pair_row);
  DeviceArray<float> d_of(size_t(T) * H);
  cuda::gather_rows_bf16(d_x.ptr, d_rp.ptr, P, k, H, d_xp.ptr, nullptr);
  const auto xp = d_xp.download();
  for (int r = 0; r < P; ++r)
    ASSERT_EQ(0, std::memcmp(&xp[size_t(r) * H], &x[size_t(row_pair[size_t(r)] / k) * H], size_t(H) * 2)) << r;

  for (bool with_shared : {false, true}) {
    cuda::combine_rows(d_y.ptr, d_pr.ptr, with_shared ? d_sh.ptr : nullptr, T, k, H, d_of.ptr, nullptr);
    cuda::combine_rows(d_y.ptr, d_pr.ptr, with_shared ? d_sh.ptr : nullptr, T, k, H, d_ob.ptr, nullptr);
    const auto of = d_of.download();
    const auto ob = d_ob.download();
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < H; ++j) {
        float ref = 0;
        for (int s = 0; s < k; ++s) ref += bf16_to_float(y[size_t(pair_row[size_t(t * k + s)]) * H + j]);
        if (with_shared) ref += bf16_to_float(sh[size_t(t) * H + j]);
        ASSERT_EQ(of[size_t(t) * H + j], ref) << t << "," << j;
        ASSERT_EQ(ob[size_t(t) * H + j], float_to_bf16(ref));
      }
  }
}

TEST(Permute, RejectsBadShapes) {
  FP4MOE_SKIP_WITHOUT_GPU();
  cuda::PermuteArgs a;
  a.num_experts = 5000;
  a.tokens = 1;
  a.top_k = 1;
  EXPECT_THROW(cuda::build_permutation(a, nullptr), Error);
  EXPECT_THROW(cuda::gather_rows_bf16(nullptr, nullptr, 1, 1, 12, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe
