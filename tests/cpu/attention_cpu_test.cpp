// CPU attention ops over the paged cache: KV append, MLA (absorbed, dense and sparse),
// indexer scores and top-k, against naive double-precision references on dense arrays.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cpu/attention/indexer_cpu.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cpu/attention/mla_cpu.hpp"
#include "format/codecs.hpp"
#include "paged_kv_test_util.hpp"

using namespace fp4moe;
using test::PagedBatch;
using test::random_floats;

namespace {

float roundtrip(KvElem e, float scale, float x) {
  if (e == KvElem::F32) return x;
  if (e == KvElem::BF16) return round_to_bf16(x);
  return e4m3_to_float(e4m3_from_float(x / scale)) * scale;
}

// Fills every position of every request with random rows; returns the decoded values as
// dense [request][position][dim] arrays (what the ops must see).
struct DenseKv {
  std::vector<std::vector<float>> ckv, kpe, idx;  // per request: [len, dim]
};

DenseKv fill_cache(PagedBatch& pb, uint32_t seed) {
  const auto full = pb.full_positions();
  const KvBatchView fb = pb.full_batch(full);
  const int64_t n = fb.num_tokens;
  const auto ckv = random_floats(size_t(n * pb.layer.ckv_dim), seed, 0.5f);
  const auto kpe = random_floats(size_t(n * pb.layer.kpe_dim), seed + 1, 0.5f);
  const auto idx = random_floats(size_t(n * std::max<int64_t>(pb.layer.index_dim, 1)), seed + 2, 0.5f);
  cpu::kv_append_cpu(pb.layer, fb, ckv.data(), kpe.data(), pb.layer.index_k ? idx.data() : nullptr);
  DenseKv d;
  for (size_t r = 0; r < pb.kv_len.size(); ++r) {
    const int64_t t0 = full.qo[r], len = pb.kv_len[r];
    auto take = [&](const std::vector<float>& src, int64_t dim, KvElem e, float s) {
      std::vector<float> out(size_t(len * dim));
      for (int64_t i = 0; i < len * dim; ++i) out[size_t(i)] = roundtrip(e, s, src[size_t(t0 * dim + i)]);
      return out;
    };
    d.ckv.push_back(take(ckv, pb.layer.ckv_dim, pb.layer.elem, pb.layer.ckv_scale));
    d.kpe.push_back(take(kpe, pb.layer.kpe_dim, pb.layer.elem, pb.layer.kpe_scale));
    if (pb.layer.index_k) d.idx.push_back(take(idx, pb.layer.index_dim, pb.layer.index_elem, pb.layer.index_scale));
  }
  return d;
}

std::vector<int32_t> token_requests(const KvBatchView& b) {
  std::vector<int32_t> r(size_t(b.num_tokens));
  kv_token_requests(b, r.data());
  return r;
}

// Naive MLA in double over the dense arrays.
void mla_reference(const PagedBatch& pb, const DenseKv& d, const float* ql, const float* qr, int64_t H, float scale,
                   const int32_t* topk, int64_t k, std::vector<double>& out, std::vector<double>& lse) {
  const KvBatchView b = pb.batch();
  const int64_t C = pb.layer.ckv_dim, R = pb.layer.kpe_dim;
  const auto req = token_requests(b);
  out.assign(size_t(b.num_tokens * H * C), 0.0);
  lse.assign(size_t(b.num_tokens * H), -INFINITY);
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    std::vector<int64_t> keys;
    if (topk) {
      for (int64_t i = 0; i < k; ++i)
        if (topk[t * k + i] >= 0) keys.push_back(topk[t * k + i]);
    } else {
      for (int64_t j = 0; j <= b.positions[t]; ++j) keys.push_back(j);
    }
    const auto& ckv = d.ckv[size_t(req[size_t(t)])];
    const auto& kpe = d.kpe[size_t(req[size_t(t)])];
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t j : keys) {
        double v = 0;
        for (int64_t c = 0; c < C; ++c) v += double(ql[(t * H + h) * C + c]) * ckv[size_t(j * C + c)];
        for (int64_t c = 0; c < R; ++c) v += double(qr[(t * H + h) * R + c]) * kpe[size_t(j * R + c)];
        s.push_back(v * scale);
        mx = std::max(mx, s.back());
      }
      if (keys.empty()) continue;
      double z = 0;
      for (double v : s) z += std::exp(v - mx);
      for (size_t i = 0; i < keys.size(); ++i)
        for (int64_t c = 0; c < C; ++c)
          out[size_t((t * H + h) * C + c)] += std::exp(s[i] - mx) / z * ckv[size_t(keys[i] * C + c)];
      lse[size_t(t * H + h)] = mx + std::log(z);
    }
  }
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Lengths: a 1-token request, a decode step at 37, a 40-token prefill, a chunk at the end of 70.
const std::vector<int32_t> kLens = {1, 37, 40, 70};
const std::vector<int32_t> kNew = {1, 1, 40, 9};

}  // namespace

TEST(KvAppendCpu, RoundTripsEveryElementTypeAndLeavesOtherSlotsAlone) {
  for (KvElem e : {KvElem::F32, KvElem::BF16, KvElem::FP8_E4M3}) {
    PagedBatch pb({5, 20}, {5, 3}, 4, 16, 8, 12, e, e, 7);
    pb.layer.ckv_scale = 0.01f;
    pb.layer.kpe_scale = 0.02f;
    pb.layer.index_scale = 0.03f;
    const KvBatchView b = pb.batch();
    const auto ckv = random_floats(size_t(b.num_tokens * 16), 1), kpe = random_floats(size_t(b.num_tokens * 8), 2),
               idx = random_floats(size_t(b.num_tokens * 12), 3);
    cpu::kv_append_cpu(pb.layer, b, ckv.data(), kpe.data(), idx.data());
    const auto req = token_requests(b);
    std::vector<char> written(size_t(pb.num_pages * pb.page_size), 0);
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      const int64_t slot = kv_slot(b, pb.page_size, req[size_t(t)], b.positions[t]);
      written[size_t(slot)] = 1;
      std::vector<float> c(16), k(8), x(12);
      cpu::kv_read_slot_cpu(pb.layer, slot, c.data(), k.data(), x.data());
      for (int i = 0; i < 16; ++i) ASSERT_EQ(c[size_t(i)], roundtrip(e, 0.01f, ckv[size_t(t * 16 + i)]));
      for (int i = 0; i < 8; ++i) ASSERT_EQ(k[size_t(i)], roundtrip(e, 0.02f, kpe[size_t(t * 8 + i)]));
      for (int i = 0; i < 12; ++i) ASSERT_EQ(x[size_t(i)], roundtrip(e, 0.03f, idx[size_t(t * 12 + i)]));
    }
    const size_t es = kv_elem_size(e);
    for (size_t s = 0; s < written.size(); ++s) {
      if (written[s]) continue;
      for (size_t i = 0; i < 16 * es; ++i) ASSERT_EQ(pb.ckv[s * 16 * es + i], 0xEE) << "slot " << s;
    }
  }
}

TEST(KvAppendCpu, RejectsPositionsOutsideTheCacheAndPagesOutsideThePool) {
  PagedBatch pb({8}, {8}, 4, 16, 8, 0, KvElem::BF16, KvElem::BF16, 1);
  const auto x = random_floats(8 * 16, 1);
  pb.positions[3] = 8;  // == kv_len
  EXPECT_THROW(cpu::kv_append_cpu(pb.layer, pb.batch(), x.data(), x.data(), nullptr), Error);
  pb.positions[3] = 3;
  pb.page_indices[1] = int32_t(pb.num_pages);
  EXPECT_THROW(cpu::kv_append_cpu(pb.layer, pb.batch(), x.data(), x.data(), nullptr), Error);
  pb.page_indices[1] = 0;
  EXPECT_THROW(cpu::kv_append_cpu(pb.layer, pb.batch(), x.data(), x.data(), x.data()), Error);  // no index array
}

TEST(MlaAttentionCpu, DenseCausalMatchesNaiveReference) {
  for (int64_t page_size : {1, 3, 16})
    for (KvElem e : {KvElem::F32, KvElem::BF16, KvElem::FP8_E4M3}) {
      PagedBatch pb(kLens, kNew, page_size, 64, 16, 0, e, e, 11);
      pb.layer.ckv_scale = 0.01f;
      pb.layer.kpe_scale = 0.005f;
      const DenseKv d = fill_cache(pb, 5);
      const KvBatchView b = pb.batch();
      const int64_t H = 5;
      const auto ql = random_floats(size_t(b.num_tokens * H * 64), 21), qr = random_floats(size_t(b.num_tokens * H * 16), 22);
      std::vector<float> out(size_t(b.num_tokens * H * 64), NAN), lse(size_t(b.num_tokens * H), NAN);
      cpu::MlaAttentionParams prm;
      prm.num_heads = H;
      prm.sm_scale = 0.125f;
      cpu::mla_attention_cpu(pb.layer, b, ql.data(), qr.data(), prm, out.data(), lse.data());
      std::vector<double> ro, rl;
      mla_reference(pb, d, ql.data(), qr.data(), H, 0.125f, nullptr, 0, ro, rl);
      EXPECT_LT(rel_l2(out, ro), 2e-6) << "page " << page_size << " " << kv_elem_name(e);
      for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], rl[i], 1e-4 * std::max(1.0, std::fabs(rl[i])));
    }
}

TEST(MlaAttentionCpu, SparseMatchesNaiveReferenceAndAllCausalKeysEqualDense) {
  PagedBatch pb(kLens, kNew, 5, 32, 8, 0, KvElem::BF16, KvElem::BF16, 3);
  const DenseKv d = fill_cache(pb, 9);
  const KvBatchView b = pb.batch();
  const int64_t H = 3, K = 12;
  const auto ql = random_floats(size_t(b.num_tokens * H * 32), 1), qr = random_floats(size_t(b.num_tokens * H * 8), 2);
  // Random subsets of [0, p], shuffled, padded with -1 anywhere in the row.
  std::mt19937 rng(4);
  std::vector<int32_t> topk(size_t(b.num_tokens * K));
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    std::vector<int32_t> cand(size_t(b.positions[t] + 1));
    std::iota(cand.begin(), cand.end(), 0);
    std::shuffle(cand.begin(), cand.end(), rng);
    const int64_t take = std::min<int64_t>(int64_t(cand.size()), 1 + int64_t(rng() % K));
    for (int64_t i = 0; i < K; ++i) topk[size_t(t * K + i)] = i < take ? cand[size_t(i)] : -1;
    std::shuffle(topk.begin() + t * K, topk.begin() + (t + 1) * K, rng);
  }
  cpu::MlaAttentionParams prm;
  prm.num_heads = H;
  prm.sm_scale = 0.2f;
  prm.topk = topk.data();
  prm.topk_k = K;
  std::vector<float> out(size_t(b.num_tokens * H * 32), NAN), lse(size_t(b.num_tokens * H));
  cpu::mla_attention_cpu(pb.layer, b, ql.data(), qr.data(), prm, out.data(), lse.data());
  std::vector<double> ro, rl;
  mla_reference(pb, d, ql.data(), qr.data(), H, 0.2f, topk.data(), K, ro, rl);
  EXPECT_LT(rel_l2(out, ro), 2e-6);

  // Every causal key listed (in reverse order, padded): same as dense.
  const int64_t K2 = 80;
  std::vector<int32_t> all(size_t(b.num_tokens * K2), -1);
  for (int64_t t = 0; t < b.num_tokens; ++t)
    for (int32_t j = 0; j <= b.positions[t]; ++j) all[size_t(t * K2 + b.positions[t] - j)] = j;
  prm.topk = all.data();
  prm.topk_k = K2;
  std::vector<float> sparse(out.size()), dense(out.size());
  cpu::mla_attention_cpu(pb.layer, b, ql.data(), qr.data(), prm, sparse.data(), nullptr);
  prm.topk = nullptr;
  cpu::mla_attention_cpu(pb.layer, b, ql.data(), qr.data(), prm, dense.data(), nullptr);
  for (size_t i = 0; i < dense.size(); ++i) ASSERT_NEAR(sparse[i], dense[i], 1e-5f);
}

TEST(MlaAttentionCpu, RejectsNonCausalAndDuplicateSparseEntries) {
  PagedBatch pb({6}, {2}, 2, 16, 8, 0, KvElem::F32, KvElem::F32, 1);
  fill_cache(pb, 1);
  const auto q = random_floats(2 * 16, 3);
  std::vector<float> out(2 * 16);
  cpu::MlaAttentionParams prm;
  prm.num_heads = 1;
  prm.sm_scale = 1;
  prm.topk_k = 2;
  std::vector<int32_t> bad = {0, 5, 1, 2};  // token 0 is at position 4: key 5 is in its future
  prm.topk = bad.data();
  EXPECT_THROW(cpu::mla_attention_cpu(pb.layer, pb.batch(), q.data(), q.data(), prm, out.data(), nullptr), Error);
  std::vector<int32_t> dup = {1, 1, -1, 2};
  prm.topk = dup.data();
  EXPECT_THROW(cpu::mla_attention_cpu(pb.layer, pb.batch(), q.data(), q.data(), prm, out.data(), nullptr), Error);
  std::vector<int32_t> none = {-1, -1, 0, 5};  // empty selection: zeros, lse -inf
  prm.topk = none.data();
  std::vector<float> lse(2);
  cpu::mla_attention_cpu(pb.layer, pb.batch(), q.data(), q.data(), prm, out.data(), lse.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[size_t(i)], 0.0f);
  EXPECT_EQ(lse[0], -INFINITY);
}

TEST(IndexerCpu, ScoresMatchNaiveReferenceWithFutureColumnsMinusInf) {
  for (KvElem e : {KvElem::F32, KvElem::BF16, KvElem::FP8_E4M3}) {
    PagedBatch pb(kLens, kNew, 7, 8, 4, 32, KvElem::BF16, e, 13);
    pb.layer.index_scale = 0.01f;
    const DenseKv d = fill_cache(pb, 2);
    const KvBatchView b = pb.batch();
    const int64_t H = 6, D = 32, stride = 75;
    const auto q = random_floats(size_t(b.num_tokens * H * D), 5), w = random_floats(size_t(b.num_tokens * H), 6);
    std::vector<float> s(size_t(b.num_tokens * stride), NAN);
    cpu::IndexerParams prm;
    prm.n_heads = H;
    prm.softmax_scale = 1.0f / std::sqrt(float(D));
    cpu::indexer_scores_cpu(pb.layer, b, q.data(), w.data(), prm, s.data(), stride);
    const auto req = token_requests(b);
    for (int64_t t = 0; t < b.num_tokens; ++t)
      for (int64_t j = 0; j < stride; ++j) {
        const float got = s[size_t(t * stride + j)];
        if (j > b.positions[t]) {
          ASSERT_EQ(got, -INFINITY);
          continue;
        }
        double ref = 0;
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c)
            dot += double(q[size_t((t * H + h) * D + c)]) * d.idx[size_t(req[size_t(t)])][size_t(j * D + c)];
          ref += w[size_t(t * H + h)] * std::max(0.0, dot * prm.softmax_scale);
        }
        ASSERT_NEAR(got, ref, 1e-5 * (1 + std::fabs(ref))) << "t " << t << " j " << j;
      }
  }
}

TEST(IndexerCpu, TopkIsDenseCausalUpToKThenBestScoresLowerPositionOnTies) {
  // Tokens at positions 2, 5 and 9 with k = 4.
  const std::vector<int32_t> qo = {0, 3}, pos = {2, 5, 9}, len = {10}, pind = {0, 1}, pages = {0};
  const KvBatchView b{1, 3, qo.data(), pos.data(), len.data(), pind.data(), pages.data()};
  const int64_t stride = 10, K = 4;
  std::vector<float> s(size_t(3 * stride), -INFINITY);
  const float row1[] = {1, 5, 5, 0, 5, 2};                 // ties at 5: positions 1, 2, 4; then 2 at 5
  const float row2[] = {NAN, 3, 3, 3, 3, 3, -1, 9, NAN, 3};  // 9 at 7, then the lowest three of the 3s
  std::copy(row1, row1 + 6, s.begin() + stride);
  std::copy(row2, row2 + 10, s.begin() + 2 * stride);
  std::vector<int32_t> topk(size_t(3 * K), 99);
  cpu::indexer_topk_cpu(b, s.data(), stride, K, topk.data());
  EXPECT_EQ(std::vector<int32_t>(topk.begin(), topk.begin() + 4), (std::vector<int32_t>{0, 1, 2, -1}));
  EXPECT_EQ(std::vector<int32_t>(topk.begin() + 4, topk.begin() + 8), (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(topk.begin() + 8, topk.end()), (std::vector<int32_t>{1, 2, 3, 7}));
}

TEST(IndexerCpu, TopkEqualsFullSortOnRandomScores) {
  std::mt19937 rng(1);
  const int64_t T = 40, stride = 300, K = 17;
  std::vector<int32_t> qo = {0, int32_t(T)}, pos(static_cast<size_t>(T)), len = {300}, pind = {0, 1}, pages = {0};
  for (auto& p : pos) p = int32_t(rng() % 300);
  const KvBatchView b{1, T, qo.data(), pos.data(), len.data(), pind.data(), pages.data()};
  auto s = random_floats(size_t(T * stride), 2);
  for (size_t i = 0; i < s.size(); i += 7) s[i] = std::round(s[i]);  // plenty of ties
  std::vector<int32_t> topk(size_t(T * K));
  cpu::indexer_topk_cpu(b, s.data(), stride, K, topk.data(), 2);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = pos[size_t(t)] + 1;
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t c) { return s[size_t(t * stride + a)] > s[size_t(t * stride + c)]; });
    idx.resize(size_t(std::min(n, K)));
    std::sort(idx.begin(), idx.end());
    idx.resize(size_t(K), -1);
    ASSERT_EQ(std::vector<int32_t>(topk.begin() + t * K, topk.begin() + (t + 1) * K), idx) << "token " << t;
  }
}

TEST(PagedKv, SlotsOfPositionsFollowThePageTableAndKeepPadding) {
  const std::vector<int32_t> qo = {0, 1, 2}, pos = {4, 6}, len = {5, 7}, pind = {0, 2, 4}, pages = {3, 0, 2, 1};
  const KvBatchView b{2, 2, qo.data(), pos.data(), len.data(), pind.data(), pages.data()};
  const std::vector<int32_t> sel = {0, 3, 4, -1, 6};
  std::vector<int32_t> slots(5);
  kv_slots_of_positions(b, 4, 1, sel.data(), 5, slots.data());  // request 1: pages 2, 1
  EXPECT_EQ(slots, (std::vector<int32_t>{8, 11, 4, -1, 6}));
  const int32_t bad = 7;
  EXPECT_THROW(kv_slots_of_positions(b, 4, 1, &bad, 1, slots.data()), Error);
}
