// The device-built FlashInfer MLA decode schedule (cuda/attention/mla_fi_schedule.hpp), run on
// the CPU thread by thread: every row's keys covered once by its items, tile-aligned starts,
// ends within kv_len, each CTA's items where work_indptr says, and every final row merged
// from exactly the partial rows its items write. The GPU test (mla_attention_test) runs it
// through the kernel against the CPU attention.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/attention/mla_fi_schedule.hpp"

namespace fs = fp4moe::cuda::attention::fi_sched;

namespace {

constexpr int32_t kPoison = -7777777;

struct Case {
  int rows, ctas, top_k, page_size, splits;  // splits 0: splits_for
  std::vector<int32_t> kv_len, page_indptr, positions;
};

Case make_case(std::mt19937& rng, int rows, int ctas, bool sparse, int max_len, int splits) {
  Case c{rows, ctas, sparse ? 64 * (1 + int(rng() % 4)) : 0, 1 << (rng() % 7), splits, {}, {}, {}};
  c.page_indptr.push_back(0);
  for (int r = 0; r < rows; ++r) {
    const int32_t len = 1 + int32_t(rng() % uint32_t(max_len));
    if (sparse) {
      c.positions.push_back(len - 1);
    } else {
      c.kv_len.push_back(len);
      c.page_indptr.push_back(c.page_indptr.back() + (len + c.page_size - 1) / c.page_size);
    }
  }
  return c;
}

int row_len(const Case& c, int r) { return c.top_k ? std::min(c.top_k, c.positions[size_t(r)] + 1) : c.kv_len[size_t(r)]; }

void check(const Case& c) {
  int max_keys = 1;
  for (int r = 0; r < c.rows; ++r) max_keys = std::max(max_keys, row_len(c, r));
  const int splits = c.splits ? c.splits : fs::splits_for(c.rows, max_keys, c.ctas);
  if (!c.splits) {  // the chosen count: within the partial buffer and at least a tile per split
    if (splits > 1) {
      ASSERT_LE(c.rows * splits, 2 * c.ctas);
    }
    ASSERT_LE(splits, std::max(1, (max_keys + fs::kTileKeys - 1) / fs::kTileKeys));
  }
  const int n = c.rows * splits, N = c.rows * fs::kRowsPerToken;
  const fs::Layout l = fs::layout(std::max(n, 1), c.ctas);
  std::vector<int32_t> ws(size_t(l.bytes / 4), kPoison);
  fs::Params p;
  p.kv_len = c.kv_len.data();
  p.page_indptr = c.page_indptr.data();
  p.positions = c.positions.data();
  p.top_k = c.top_k;
  p.rows = c.rows;
  p.splits = splits;
  p.ctas = c.ctas;
  p.ws = reinterpret_cast<unsigned char*>(ws.data());
  p.l = l;
  for (int i = 0; i < fs::threads(p); ++i) fs::write(p, i);
  auto arr = [&](int64_t off) { return ws.data() + off / 4; };

  // Every item slot written; CTA c's items are [work_indptr[c], work_indptr[c + 1]), evenly dealt.
  const int32_t* wi = arr(l.work_indptr);
  ASSERT_EQ(wi[0], 0);
  ASSERT_EQ(wi[c.ctas], n);
  for (int k = 0; k < c.ctas; ++k) {
    ASSERT_LE(wi[k], wi[k + 1]);
    ASSERT_LE(wi[k + 1] - wi[k], n / c.ctas + 1);
    ASSERT_GE(wi[k + 1] - wi[k], n / c.ctas);
  }
  for (int64_t off : {l.q_indptr, l.kv_indptr, l.partial_indptr, l.q_len, l.kv_len, l.q_start, l.kv_start, l.kv_end})
    for (int w = 0; w < n; ++w) ASSERT_NE(arr(off)[w], kPoison) << "item slot " << w << " not written";

  // Per row: splits items, aligned starts, ends within the full length, the keys covered once.
  std::vector<std::vector<std::pair<int, int>>> ranges(size_t(c.rows));
  std::set<int32_t> partial_rows;
  for (int w = 0; w < n; ++w) {
    const int r = arr(l.q_indptr)[w];
    ASSERT_GE(r, 0);
    ASSERT_LT(r, c.rows);
    const int L = row_len(c, r);
    EXPECT_EQ(arr(l.q_len)[w], 1);
    EXPECT_EQ(arr(l.q_start)[w], 0);
    EXPECT_EQ(arr(l.kv_len)[w], L);
    EXPECT_EQ(arr(l.kv_indptr)[w], c.top_k ? r * c.top_k : c.page_indptr[size_t(r)]);
    const int ks = arr(l.kv_start)[w], ke = arr(l.kv_end)[w];
    EXPECT_EQ(ks % fs::kTileKeys, 0) << "row " << r;
    EXPECT_LE(ke, L);
    EXPECT_LE(ks, ke);
    ranges[size_t(r)].push_back({ks, ke});
    const int pi = arr(l.partial_indptr)[w];
    if (splits == 1) {
      EXPECT_EQ(pi, -1);
    } else {
      ASSERT_GE(pi, 0);
      EXPECT_EQ((pi % N) / fs::kRowsPerToken, r);
      for (int h = 0; h < fs::kRowsPerToken; ++h) EXPECT_TRUE(partial_rows.insert(pi + h).second) << "row written twice";
      EXPECT_LE(pi + fs::kRowsPerToken, splits * N);
    }
  }
  for (int r = 0; r < c.rows; ++r) {
    auto& v = ranges[size_t(r)];
    ASSERT_EQ(int(v.size()), splits);
    std::sort(v.begin(), v.end());
    int covered = 0;
    for (auto [ks, ke] : v) {
      if (ks == ke) continue;  // an empty split
      EXPECT_EQ(ks, covered) << "row " << r << ": a gap or an overlap";
      covered = ke;
    }
    EXPECT_EQ(covered, row_len(c, r)) << "row " << r;
  }

  // Merges: the slots' final rows tile [0, N) once; final row f merges f + k N, k < splits.
  std::vector<int> merged(size_t(N), 0);
  for (int m = 0; m < c.ctas; ++m) {
    const int st = arr(l.merge_start)[m], en = arr(l.merge_end)[m];
    ASSERT_LE(st, en);
    if (splits == 1) {
      EXPECT_EQ(st, en);
      continue;
    }
    EXPECT_EQ(arr(l.merge_p_start)[m], st);
    EXPECT_EQ(arr(l.merge_p_end)[m], splits * N);
    EXPECT_EQ(arr(l.merge_stride)[m], N);
    for (int f = st; f < en; ++f) {
      ++merged[size_t(f)];
      for (int k = 0; k < splits; ++k) EXPECT_TRUE(partial_rows.count(f + k * N)) << "final row " << f << " split " << k;
    }
  }
  if (splits > 1) {
    for (int f = 0; f < N; ++f) ASSERT_EQ(merged[size_t(f)], 1) << "final row " << f;
  }
}

}  // namespace

TEST(MlaFiSchedule, DenseRowsAreCoveredOnceAndMergedFromTheirOwnPartials) {
  std::mt19937 rng(1);
  for (int rows : {1, 2, 3, 16, 64, 100, 131, 132, 133, 264, 300})
    for (int max_len : {1, 64, 65, 1000, 9000}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, lengths <= " << max_len);
      check(make_case(rng, rows, 132, false, max_len, 0));
    }
}

TEST(MlaFiSchedule, SparseRowsUseTheirTopKSlots) {
  std::mt19937 rng(2);
  for (int rows : {1, 7, 66, 132, 500})
    for (int max_len : {1, 100, 5000}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, positions < " << max_len);
      check(make_case(rng, rows, 132, true, max_len, 0));
    }
}

TEST(MlaFiSchedule, ForcedSplitsLeaveEmptyItemsAlignedAtZero) {
  std::mt19937 rng(3);
  for (int splits : {1, 2, 5, 16})
    for (int ctas : {1, 3, 132}) {
      SCOPED_TRACE(::testing::Message() << splits << " splits, " << ctas << " ctas");
      Case c = make_case(rng, 4, ctas, false, 300, splits);
      c.kv_len[0] = 1;  // shorter than one split: the other splits are empty
      c.page_indptr.assign(1, 0);
      for (int32_t len : c.kv_len) c.page_indptr.push_back(c.page_indptr.back() + (len + c.page_size - 1) / c.page_size);
      check(c);
    }
}

TEST(MlaFiSchedule, SplitCountGivesMlaPlanChunksWithinOneWave) {
  // rows x keys / ctas rounded up to MLAPlan's chunk (64 here at the least / 128 / 192 / 256 k)
  EXPECT_EQ(fs::chunk_keys_for(1, 1024, 132), 64);  // 8 keys per CTA
  EXPECT_EQ(fs::splits_for(1, 1024, 132), 16);
  EXPECT_EQ(fs::chunk_keys_for(16, 1024, 132), 256);  // 125 keys per CTA
  EXPECT_EQ(fs::splits_for(16, 1024, 132), 4);
  EXPECT_EQ(fs::chunk_keys_for(1, 8192, 132), 192);  // 63
  EXPECT_EQ(fs::splits_for(1, 8192, 132), 43);
  EXPECT_EQ(fs::splits_for(1, 32768, 132), 128);        // 249 -> 256 keys per split
  EXPECT_EQ(fs::splits_for(1, 128 * 1024, 132), 128);   // 993 -> 1024
  EXPECT_EQ(fs::splits_for(16, 128 * 1024, 132), 8);    // 9 chunks of 16128, capped at one wave
  EXPECT_EQ(fs::splits_for(64, 32768, 132), 2);         // 3 chunks of 16128, capped
  EXPECT_EQ(fs::splits_for(16, 2048, 132), 8);          // DSA top-k rows: 249 -> 256
  EXPECT_EQ(fs::splits_for(16, 8192, 132), 8);          // 993 -> 1024
  EXPECT_EQ(fs::splits_for(64, 8192, 132), 2);          // 3972 -> 4096
  EXPECT_EQ(fs::splits_for(132, 8192, 132), 1);
  EXPECT_EQ(fs::splits_for(133, 8192, 132), 1);
  EXPECT_EQ(fs::splits_for(4, 1, 132), 1);
  for (int rows : {1, 2, 5, 16, 64, 100, 132, 200, 2048})
    for (int keys : {1, 63, 64, 65, 1000, 2048, 4096, 8192, 131072}) {
      const int s = fs::splits_for(rows, keys, 132), chunk = fs::chunk_keys_for(rows, keys, 132);
      EXPECT_EQ(chunk % fs::kTileKeys, 0) << rows << " x " << keys;
      if (s > 1) {
        EXPECT_LE(int64_t(rows) * s, 132) << rows << " x " << keys;  // one wave
      }
      EXPECT_LE(s, (keys + fs::kTileKeys - 1) / fs::kTileKeys) << rows << " x " << keys;  // a tile each
    }
}
