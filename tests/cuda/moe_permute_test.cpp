// Permutation, gather and combine vs simple CPU references: offsets = exclusive scan of
// the per-expert counts; inside an expert rows ordered by (token, slot); the two maps
// inverse of each other; gather copies rows bit-exactly; combine sums in slot order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <ostream>
#include <tuple>

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

// X extra experts: every token also selects experts E..E+X-1 (slots k..k+X-1, weight 1).
struct PermCase { int T, k, E; Pattern p; int X = 0; };

std::ostream& operator<<(std::ostream& os, const PermCase& c) {
  return os << "T" << c.T << "_k" << c.k << "_E" << c.E << "_X" << c.X << "_p" << int(c.p);
}

class PermuteTest : public ::testing::TestWithParam<PermCase> {};

// Both paths (fused small, chunked large: picked by T*R) against a CPU reference: a stable
// sort of the pair indices by expert, bit-exactly; the fused gather against a plain copy.
TEST_P(PermuteTest, OffsetsOrderMapsAndGather) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const auto [T, k, E, pattern, X] = GetParam();
  const int R = k + X, P = T * R, Eall = E + X, H = 40;
  const auto ids = make_ids(T, k, E, pattern, 1234 + T);
  const auto w = test::random_floats(size_t(T) * k, 7, 0.f, 1.f);
  std::vector<uint16_t> x(size_t(T) * H);
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint16_t(i * 2654435761u >> 7);
  DeviceArray<int32_t> d_ids(ids), d_off(size_t(Eall + 1)), d_row_pair(static_cast<size_t>(P)),
      d_pair_row(static_cast<size_t>(P));
  DeviceArray<float> d_w(w), d_row_w(static_cast<size_t>(P));
  DeviceArray<uint8_t> scratch(cuda::permute_scratch_bytes(P, Eall));
  DeviceArray<uint16_t> d_x(x), d_xp(size_t(P) * H);
  cuda::PermuteArgs a;
  a.topk_ids = d_ids.ptr;
  a.topk_weights = d_w.ptr;
  a.tokens = T;
  a.top_k = k;
  a.num_experts = E;
  a.extra_experts = X;
  a.expert_offsets = d_off.ptr;
  a.row_pair = d_row_pair.ptr;
  a.pair_row = d_pair_row.ptr;
  a.row_weight = d_row_w.ptr;
  a.scratch = scratch.ptr;
  a.x = d_x.ptr;
  a.x_perm = d_xp.ptr;
  a.hidden = H;
  cuda::build_permutation(a, nullptr);
  const auto off = d_off.download();
  const auto row_pair = d_row_pair.download();
  const auto pair_row = d_pair_row.download();
  const auto row_w = d_row_w.download();
  const auto xp = d_xp.download();

  // Reference: stable sort of pair indices by expert.
  auto expert = [&](int p) { const int t = p / R, s = p % R; return s < k ? ids[size_t(t * k + s)] : E + (s - k); };
  auto weight = [&](int p) { const int t = p / R, s = p % R; return s < k ? w[size_t(t * k + s)] : 1.0f; };
  std::vector<int32_t> ref_rows(static_cast<size_t>(P));
  std::iota(ref_rows.begin(), ref_rows.end(), 0);
  std::stable_sort(ref_rows.begin(), ref_rows.end(), [&](int32_t a, int32_t b) { return expert(a) < expert(b); });
  std::vector<int32_t> ref_off(size_t(Eall + 1), 0);
  for (int p = 0; p < P; ++p) ref_off[size_t(expert(p)) + 1]++;
  for (int e = 0; e < Eall; ++e) ref_off[size_t(e) + 1] += ref_off[size_t(e)];
  ASSERT_EQ(off, ref_off);
  ASSERT_EQ(row_pair, ref_rows);
  for (int p = 0; p < P; ++p) {
    ASSERT_EQ(row_pair[size_t(pair_row[size_t(p)])], p);
    ASSERT_EQ(row_w[size_t(pair_row[size_t(p)])], weight(p));
  }
  for (int r = 0; r < P; ++r)
    ASSERT_EQ(0, std::memcmp(&xp[size_t(r) * H], &x[size_t(row_pair[size_t(r)] / R) * H], size_t(H) * 2)) << r;
  for (int j = 0; j < X; ++j) EXPECT_EQ(off[size_t(E + j) + 1] - off[size_t(E + j)], T) << "extra expert " << j;
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
                                           PermCase{300, 6, 1000, Pattern::Random},
                                           // fused small path (T*R <= 1024), with and without extra experts
                                           PermCase{1, 8, 256, Pattern::Random, 1},
                                           PermCase{1, 8, 256, Pattern::Random, 2},
                                           PermCase{37, 8, 256, Pattern::Random, 1},
                                           PermCase{113, 8, 256, Pattern::Hot, 1},
                                           PermCase{128, 8, 256, Pattern::Random},
                                           PermCase{60, 8, 1016, Pattern::Random, 8},
                                           PermCase{1024, 1, 16, Pattern::Hot},
                                           PermCase{341, 1, 16, Pattern::Cold, 2},
                                           // chunked large path with extra experts
                                           PermCase{114, 8, 256, Pattern::Random, 1},
                                           PermCase{1000, 8, 256, Pattern::Cold, 1},
                                           PermCase{4097, 8, 256, Pattern::Hot, 2}));

// The permutation enqueues only (no memset, no host sync): it captures into a graph, and a
// replay gives the eager result (fused path and chunked path).
TEST(Permute, GraphCaptureMatchesEager) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int T : {3, 500}) {
    const int k = 8, E = 256, X = 1, R = k + X, P = T * R, H = 64;
    const auto ids = make_ids(T, k, E, Pattern::Random, 99 + T);
    const auto w = test::random_floats(size_t(T) * k, 8, 0.f, 1.f);
    std::vector<uint16_t> x(size_t(T) * H);
    for (size_t i = 0; i < x.size(); ++i) x[i] = uint16_t(i * 40503u);
    DeviceArray<int32_t> d_ids(ids), d_off(size_t(E + X + 1)), d_rp(static_cast<size_t>(P)), d_pr(static_cast<size_t>(P));
    DeviceArray<float> d_w(w), d_rw(static_cast<size_t>(P));
    DeviceArray<uint8_t> scratch(cuda::permute_scratch_bytes(P, E + X));
    DeviceArray<uint16_t> d_x(x), d_xp(size_t(P) * H);
    cuda::PermuteArgs a;
    a.topk_ids = d_ids.ptr;
    a.topk_weights = d_w.ptr;
    a.tokens = T;
    a.top_k = k;
    a.num_experts = E;
    a.extra_experts = X;
    a.expert_offsets = d_off.ptr;
    a.row_pair = d_rp.ptr;
    a.pair_row = d_pr.ptr;
    a.row_weight = d_rw.ptr;
    a.scratch = scratch.ptr;
    a.x = d_x.ptr;
    a.x_perm = d_xp.ptr;
    a.hidden = H;
    cuda::build_permutation(a, nullptr);
    const auto off = d_off.download(), rp = d_rp.download();
    const auto xp = d_xp.download();
    FP4MOE_CUDA_CHECK(cudaMemset(d_off.ptr, 0xff, d_off.n * 4));
    FP4MOE_CUDA_CHECK(cudaMemset(d_rp.ptr, 0xff, d_rp.n * 4));
    FP4MOE_CUDA_CHECK(cudaMemset(d_xp.ptr, 0xff, d_xp.n * 2));
    cudaStream_t st;
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g = nullptr;
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    cuda::build_permutation(a, st);
    FP4MOE_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge = nullptr;
    FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    FP4MOE_CUDA_CHECK(cudaGraphLaunch(ge, st));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    EXPECT_EQ(d_off.download(), off) << "T=" << T;
    EXPECT_EQ(d_rp.download(), rp) << "T=" << T;
    EXPECT_EQ(d_xp.download(), xp) << "T=" << T;
  }
}

// The combine's results (f32 `of`, bf16 `ob`) against the FP32 sum in slot order of the R rows
// of every token, plus shared(t, j) last when `shared` is given: bit for bit.
void expect_combined(const std::vector<float>& of, const std::vector<uint16_t>& ob, const std::vector<uint16_t>& y,
                     const std::vector<int32_t>& pair_row, int T, int R, int H,
                     const std::function<float(int, int)>& shared) {
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < H; ++j) {
      float ref = 0;
      for (int s = 0; s < R; ++s) ref += bf16_to_float(y[size_t(pair_row[size_t(t * R + s)]) * H + j]);
      if (shared) ref += shared(t, j);
      ASSERT_EQ(of[size_t(t) * H + j], ref) << "T=" << T << " R=" << R << " " << t << "," << j;
      ASSERT_EQ(ob[size_t(t) * H + j], float_to_bf16(ref));
    }
}

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
    std::function<float(int, int)> shared;
    if (with_shared) shared = [&](int t, int j) { return bf16_to_float(sh[size_t(t) * H + j]); };
    expect_combined(d_of.download(), d_ob.download(), y, pair_row, T, k, H, shared);
  }
}

// The combine with an FP32 shared row (the BF16 shared expert's down output), bit-exact
// against the same FP32 sum in slot order; and silu_mul_rows against SiLU(g)·u in FP32 (expf:
// within 2 ulp of the host's exp, so the BF16 results agree or sit one BF16 ulp apart).
TEST(Permute, CombineWithAnF32SharedRowAndSiluMul) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int T = 37, k = 6, H = 264, P = T * k, I = 132;
  std::vector<int32_t> pair_row(static_cast<size_t>(P));
  std::iota(pair_row.begin(), pair_row.end(), 0);
  std::shuffle(pair_row.begin(), pair_row.end(), std::mt19937_64(7));
  std::vector<uint16_t> y(size_t(P) * H);
  const auto yf = test::random_floats(y.size(), 8, -3.f, 3.f);
  for (size_t i = 0; i < y.size(); ++i) y[i] = float_to_bf16(yf[i]);
  const auto sh = test::random_floats(size_t(T) * H, 9, -3.f, 3.f);
  DeviceArray<uint16_t> d_y(y), d_ob(size_t(T) * H);
  DeviceArray<int32_t> d_pr(pair_row);
  DeviceArray<float> d_sh(sh), d_of(size_t(T) * H);
  cuda::combine_rows_f32_shared(d_y.ptr, d_pr.ptr, d_sh.ptr, T, k, H, d_of.ptr, nullptr);
  cuda::combine_rows_f32_shared(d_y.ptr, d_pr.ptr, d_sh.ptr, T, k, H, d_ob.ptr, nullptr);
  expect_combined(d_of.download(), d_ob.download(), y, pair_row, T, k, H,
                  [&](int t, int j) { return sh[size_t(t) * H + j]; });
  if (HasFatalFailure()) return;

  const auto gu = test::random_floats(size_t(T) * 2 * I, 10, -8.f, 8.f);
  DeviceArray<float> d_gu(gu);
  DeviceArray<uint16_t> d_h(size_t(T) * I);  // poisoned
  cuda::silu_mul_rows(d_gu.ptr, T, I, d_h.ptr, nullptr);
  const auto h = d_h.download();
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < I; ++j) {
      const float g = gu[size_t(t) * 2 * I + j], u = gu[size_t(t) * 2 * I + I + j];
      const uint16_t want = float_to_bf16(g / (1.0f + std::exp(-g)) * u);
      const uint16_t got = h[size_t(t) * I + j];
      ASSERT_LE(std::abs(int(got) - int(want)), 1) << t << "," << j << ": " << bf16_to_float(got) << " vs "
                                                   << bf16_to_float(want);
    }
  EXPECT_THROW(cuda::silu_mul_rows(d_gu.ptr, T, 130, d_h.ptr, nullptr), Error);
}

// The combine at decode shape (T = 1, H = 6144) and with more rows per token than one load
// batch (R = 17): slot order, bit-exact.
TEST(Permute, CombineSmallTAndManyRows) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (auto [T, R, H] : {std::tuple{1, 9, 6144}, std::tuple{3, 17, 1032}, std::tuple{2, 1, 8}}) {
    const int P = T * R;
    std::vector<int32_t> row_pair(static_cast<size_t>(P));
    std::iota(row_pair.begin(), row_pair.end(), 0);
    std::shuffle(row_pair.begin(), row_pair.end(), std::mt19937_64(6 + T));
    std::vector<int32_t> pair_row(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) pair_row[size_t(row_pair[size_t(r)])] = r;
    const auto yf = test::random_floats(size_t(P) * H, 4, -3.f, 3.f);
    std::vector<uint16_t> y(yf.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = float_to_bf16(yf[i]);
    DeviceArray<uint16_t> d_y(y), d_ob(size_t(T) * H);
    DeviceArray<int32_t> d_pr(pair_row);
    DeviceArray<float> d_of(size_t(T) * H);
    cuda::combine_rows(d_y.ptr, d_pr.ptr, nullptr, T, R, H, d_of.ptr, nullptr);
    cuda::combine_rows(d_y.ptr, d_pr.ptr, nullptr, T, R, H, d_ob.ptr, nullptr);
    expect_combined(d_of.download(), d_ob.download(), y, pair_row, T, R, H, nullptr);
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
  a.num_experts = 1020;
  a.extra_experts = 5;  // 1025 in all
  EXPECT_THROW(cuda::build_permutation(a, nullptr), Error);
  a.num_experts = 16;
  a.extra_experts = cuda::kMaxPermuteExtraExperts + 1;
  EXPECT_THROW(cuda::build_permutation(a, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe
