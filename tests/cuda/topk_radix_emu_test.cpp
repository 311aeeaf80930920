// The radix top-k's kernels (cuda/indexer/topk_radix.cuh) run on the CPU through the CUDA
// emulator (tests/cuda/emu), against the CPU op (cpu/attention/indexer_cpu.hpp): identical
// positions and slots on every path — dense rows, one-CTA rows (16K boundary), long rows
// resolved among the candidates above the sampled threshold (at the first digit, or with a
// position cut among equal keys), and by streaming the row when the sample missed (too many
// candidates, or fewer than k); NaN / -inf / signed zeros; small k.
// Needs no GPU (runs in CI); indexer_test runs the same cases on the device.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/indexer/topk_radix.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <random>
#include <vector>

#include "core/paged_kv.hpp"
#include "cpu/attention/indexer_cpu.hpp"

namespace fp4moe::test {
namespace {

namespace tk = cuda::indexer::topk;

enum class Fill { Random, Ties, FewTies, Specials, ExactTopBin, TiesAtCut, Ulps, FewUlps, HotRun, SampleHot };

struct Row {
  int ctx;
  Fill fill;
};

// sample_lines: the sample SampleHot rows are built against (TopKArgs::sample_lines).
std::vector<float> make_row(int n, Fill f, int k, std::mt19937_64& g, int sample_lines = tk::kSampleLines) {
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> s(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    float v = u(g);
    if (f == Fill::Ties) v = float(int(g() % 7)) * 0.5f - 1.0f;  // 7 values: the top one ~n/7 times
    if (f == Fill::FewTies) v = float(int(g() % 3));                // 3 values: the top one ~n/3 times
    if (f == Fill::Ulps && g() % 4 != 0)  // 3 in 4 keys 1 + (0..15) ulps: equal in the top 28 bits
      v = __uint_as_float(__float_as_uint(1.0f) + uint32_t(g() % 16));
    if (f == Fill::FewUlps && g() % 10 < 3)  // 3 in 10 keys 2.5 + (0..15) ulps
      v = __uint_as_float(__float_as_uint(2.5f) + uint32_t(g() % 16));
    if (f == Fill::Specials) {
      const uint64_t r = g() % 20;
      if (r == 0) v = std::numeric_limits<float>::quiet_NaN();
      if (r == 1) v = -std::numeric_limits<float>::infinity();
      if (r == 2) v = (g() & 1) ? 0.0f : -0.0f;
      if (r == 3) v = std::numeric_limits<float>::infinity();
    }
    s[size_t(j)] = v;
  }
  if (f == Fill::ExactTopBin)  // exactly k keys in the top first-digit bin: resolved by pass 0
    for (int i = 0; i < k; ++i) s[size_t((int64_t(i) * 7919) % n)] = 100.0f + float(i % 5) * 0.5f;
  if (f == Fill::TiesAtCut)  // k / 2 clear winners, then 2000 equal keys across the cut
    for (int i = 0; i < k / 2 + 2000; ++i) s[size_t((int64_t(i) * 7919) % n)] = i < k / 2 ? 50.0f : 10.0f;
  if (f == Fill::HotRun)  // 3000 consecutive high scores (a passage the query attends to)
    for (int i = n / 3; i < n / 3 + 3000 && i < n; ++i) s[size_t(i)] += 20.0f;
  if (f == Fill::SampleHot) {  // exactly the sampled lines score high: the sample's threshold
    const int stride = tk::sample_stride(n, sample_lines);  // admits fewer than k keys, the row is streamed
    for (int g = 0; g * stride < (n + 31) / 32; ++g)
      for (int j = 0; j < 32; ++j) {
        const int64_t i = int64_t(tk::sample_line(g, stride)) * 32 + j;
        if (i < n) s[size_t(i)] += 20.0f;
      }
  }
  return s;
}

// resident: the CTAs the gather launch may take (gather_ctas_per_row); the H200's is 264.
// shared_ws: a workspace of earlier calls (zero between calls, at least this call's size), or
// nullptr for a fresh one.
// row_keys: Params::row_keys (rows up to it on the one-CTA path).
void run_case(const std::vector<Row>& rows, int k, int page_size, uint64_t seed, int slice_keys = tk::kSliceKeys,
              int resident = 264, std::vector<unsigned char>* shared_ws = nullptr, int sample_lines = tk::kSampleLines,
              int row_keys = tk::kRowKeys) {
  std::mt19937_64 g(seed);
  // One request per row (q_len 1 at the end of its context), pages shuffled.
  std::vector<int32_t> qo = {0}, pos, kvl, pip = {0}, pidx;
  int max_ctx = 0, pages_total = 0;
  for (const Row& r : rows) pages_total += (r.ctx + page_size - 1) / page_size;
  std::vector<int32_t> pool(static_cast<size_t>(pages_total));
  for (int i = 0; i < pages_total; ++i) pool[size_t(i)] = i;
  std::shuffle(pool.begin(), pool.end(), g);
  size_t next = 0;
  for (const Row& r : rows) {
    pos.push_back(r.ctx - 1);
    qo.push_back(int32_t(pos.size()));
    kvl.push_back(r.ctx);
    for (int i = 0; i < (r.ctx + page_size - 1) / page_size; ++i) pidx.push_back(pool[next++]);
    pip.push_back(int32_t(pidx.size()));
    max_ctx = std::max(max_ctx, r.ctx);
  }
  const int64_t T = int64_t(rows.size()), stride = max_ctx + 3;
  std::vector<float> scores(static_cast<size_t>(T * stride), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < T; ++t) {
    const auto row = make_row(rows[size_t(t)].ctx, rows[size_t(t)].fill, k, g, sample_lines);
    std::copy(row.begin(), row.end(), scores.begin() + t * stride);
  }
  const KvBatchView b{T, T, qo.data(), pos.data(), kvl.data(), pip.data(), pidx.data()};
  std::vector<int32_t> want(static_cast<size_t>(T * k));
  cpu::indexer_topk_cpu(b, scores.data(), stride, k, want.data());

  std::vector<int32_t> out_pos(size_t(T * k), -7), out_slot(size_t(T * k), -7);
  const tk::Layout l = tk::workspace_layout(T, max_ctx, slice_keys, row_keys);
  std::vector<unsigned char> own(shared_ws ? 0 : l.total + 16, 0);
  std::vector<unsigned char>& ws = shared_ws ? *shared_ws : own;
  ASSERT_GE(ws.size(), l.total);
  std::vector<int32_t> counts(static_cast<size_t>(T), -1);
  tk::Params p{};
  p.scores = scores.data();
  p.score_stride = stride;
  p.qo_indptr = qo.data();
  p.positions = pos.data();
  p.page_indptr = pip.data();
  p.page_indices = pidx.data();
  p.num_requests = int(T);
  p.top_k = k;
  p.out_pos = out_pos.data();
  p.out_slot = out_slot.data();
  p.page_shift = __builtin_ctz(unsigned(page_size));
  p.max_ctx = max_ctx;
  p.row_keys = row_keys;
  p.slice_keys = slice_keys;
  p.sample_lines = sample_lines;
  p.cand_counts = counts.data();
  if (l.total) tk::bind_workspace(p, ws.data(), l);
  const dim3 grid(unsigned(l.slices > 0 ? tk::gather_ctas_per_row(T, l.slices, resident) : 1), unsigned(T));
  for (int call = 0; call < 2; ++call) {  // twice: the workspace must come back zeroed
    std::fill(out_pos.begin(), out_pos.end(), -7);
    emu::launch(dim3(1, unsigned(T)), dim3(tk::kThreads), tk::select_smem_bytes(max_ctx, row_keys),
                tk::topk_select_or_sample_kernel, p);
    if (l.total) emu::launch(grid, dim3(tk::kThreads), tk::gather_smem_bytes(), tk::topk_gather_kernel, p);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int32_t> got(out_pos.begin() + t * k, out_pos.begin() + (t + 1) * k),
          exp(want.begin() + t * k, want.begin() + (t + 1) * k);
      ASSERT_EQ(got, exp) << "slice " << slice_keys << " row " << t << " ctx " << rows[size_t(t)].ctx << " fill " << int(rows[size_t(t)].fill)
                          << " call " << call;
      for (int i = 0; i < k; ++i) {
        const int32_t q = exp[size_t(i)];
        ASSERT_EQ(out_slot[size_t(t * k + i)], q < 0 ? -1 : int32_t(kv_slot(b, page_size, t, q)))
            << "row " << t << " entry " << i;
      }
    }
    if (l.total) {
      for (int64_t t = 0; t < T; ++t) {
        // The path taken (the candidate count): the sample holds on unstructured rows and
        // misses, by design, on the rows built against it.
        const Fill f = rows[size_t(t)].fill;
        const uint32_t n = uint32_t(counts[size_t(t)]);
        const bool streamed = n < uint32_t(k) || n > uint32_t(tk::kCandCap);
        if (rows[size_t(t)].ctx > row_keys && (f == Fill::Random || f == Fill::HotRun || f == Fill::TiesAtCut ||
                                                   f == Fill::ExactTopBin)) {
          EXPECT_FALSE(streamed) << "row " << t << " fill " << int(f) << ": " << n << " candidates";
        }
        if (rows[size_t(t)].ctx > row_keys && (f == Fill::SampleHot || f == Fill::FewTies)) {
          EXPECT_TRUE(streamed) << "row " << t << " fill " << int(f) << ": " << n << " candidates";
        }
      }
      // All of it zero again (row states, candidates, bitmaps): the next call may lay it out
      // for another row count.
      ASSERT_EQ(std::count(ws.begin(), ws.end(), 0), std::ptrdiff_t(ws.size())) << "call " << call;
    }
  }
}

// narrow() alone: n order keys in shared memory, the need-th largest sought. Out: the selection
// (prefix, mask, need left), whether a bin was taken whole, and the compacted count (-1: none).
struct NarrowProbe {
  const uint32_t* keys;
  int n, need;
  int64_t* out;
};
void narrow_probe_kernel(const NarrowProbe q) {
  FP4MOE_DYNAMIC_SMEM(int, hist);
  int* scratch = hist + tk::kBins0;
  uint32_t* k = reinterpret_cast<uint32_t*>(scratch + tk::kScratchInts);
  for (int i = int(threadIdx.x); i < q.n; i += tk::kThreads) k[i] = q.keys[i];
  __syncthreads();
  tk::Sel sel{0u, 0u, q.need};
  auto get = [&](int i, uint32_t& key) {
    key = k[i];
    return true;
  };
  const tk::Narrowed r = tk::narrow(get, q.n, sel, hist, scratch);
  if (threadIdx.x == 0) {
    q.out[0] = sel.prefix, q.out[1] = sel.mask, q.out[2] = sel.need, q.out[3] = r.whole, q.out[4] = r.list_n;
  }
}

// Both of narrow's paths against a sort: the first pass's bin compacted (it holds <= kListCap
// keys) or not (more: heavy ties), a bin taken whole at the first pass, T found to all 32 bits.
TEST(TopKRadixEmu, NarrowFindsTheNeedthLargestKeyWithAndWithoutTheList) {
  enum Path { Listed, NotListed, Either };
  struct Case {
    int n;
    Fill fill;
    int need;
    Path path;
  };
  const Case cases[] = {{8000, Fill::Random, 2048, Listed},     {16384, Fill::Random, 4096, Listed},
                        {16000, Fill::Ties, 2048, NotListed},    {6000, Fill::Ulps, 2048, NotListed},
                        {8000, Fill::FewUlps, 2048, NotListed},  {8000, Fill::TiesAtCut, 2048, Listed},
                        {9000, Fill::ExactTopBin, 2048, Either}, {3000, Fill::Specials, 7, Either},
                        {5000, Fill::Random, 1, Either},         {5000, Fill::Random, 5000, Either}};
  std::mt19937_64 g(11);
  for (const Case& c : cases) {
    const std::vector<float> row = make_row(c.n, c.fill, c.need, g);
    std::vector<uint32_t> keys(row.size());
    for (size_t i = 0; i < row.size(); ++i) keys[i] = tk::order_key(row[i]);
    std::vector<int64_t> out(5, -7);
    emu::launch(dim3(1), dim3(tk::kThreads), tk::select_smem_bytes(c.n), narrow_probe_kernel,
                NarrowProbe{keys.data(), c.n, c.need, out.data()});
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const uint32_t t = sorted[size_t(c.need - 1)], prefix = uint32_t(out[0]), mask = uint32_t(out[1]);
    int above = 0, in_bin = 0, first_bin = 0;
    for (uint32_t k : keys) {
      above += (k & mask) > prefix;
      in_bin += (k & mask) == prefix;
      first_bin += (k >> 20) == (t >> 20);
    }
    const std::string what = "n " + std::to_string(c.n) + " fill " + std::to_string(int(c.fill));
    EXPECT_EQ(t & mask, prefix) << what;
    EXPECT_EQ(out[2], c.need - above) << what;
    if (out[3]) {
      EXPECT_EQ(in_bin, out[2]) << what;  // the bin's keys are exactly the ones still needed
    } else {
      EXPECT_EQ(mask, 0xffffffffu) << what;
      EXPECT_EQ(prefix, t) << what;
    }
    const bool listed = out[4] >= 0;
    if (listed) {
      EXPECT_EQ(out[4], first_bin) << what;
    }
    if (c.path == Listed) {
      EXPECT_TRUE(listed) << what;
    }
    if (c.path == NotListed) {
      EXPECT_FALSE(listed) << what;
    }
  }
}

TEST(TopKRadixEmu, OneCtaRowsMatchCpu) {
  run_case({{1, Fill::Random}, {2048, Fill::Random}, {2049, Fill::Ties}, {5000, Fill::Random},
            {9000, Fill::Specials}, {16384, Fill::Random}, {6000, Fill::Ulps}},
           2048, 64, 1);
}

// One CTA for rows up to 32K keys (Params::row_keys = kRowKeysLarge): the row in shared memory in
// two load batches, every narrowing path (unique T, a bin taken whole, ties cut by position, heavy
// ties past the compaction list, specials, keys ulps apart), beside a longer row on the sampled path.
TEST(TopKRadixEmu, RowsUpTo32KOnOneCtaMatchCpu) {
  run_case({{16385, Fill::Random},
            {20000, Fill::ExactTopBin},
            {18000, Fill::TiesAtCut},
            {30000, Fill::FewTies},
            {32768, Fill::Specials},
            {32768, Fill::Ulps},
            {24000, Fill::HotRun},
            {40000, Fill::Random},
            {3000, Fill::Random}},
           2048, 16, 9, tk::kSliceKeys, 264, nullptr, tk::kSampleLines, tk::kRowKeysLarge);
}

TEST(TopKRadixEmu, LongRowsMatchCpuOnEveryPath) {
  run_case({{16385, Fill::Random},        // candidates, T unique
            {20000, Fill::ExactTopBin},   // candidates, resolved by the first digit
            {18000, Fill::TiesAtCut},     // candidates, position cut among 2000 equal keys
            {17000, Fill::Ties},          // candidates: ~2400 equal keys, position cut
            {30000, Fill::FewTies},       // ~10000 > kCandCap keys equal to the threshold: streamed
            {17000, Fill::Specials},      // NaN, +-inf, signed zeros
            {17000, Fill::Ulps},          // ~12700 keys within 16 ulps: streamed, every digit needed
            {17000, Fill::FewUlps},       // ~5100 keys within 16 ulps: candidates, every digit needed
            {40000, Fill::TiesAtCut},     // more slices
            {70000, Fill::HotRun},        // a run of high scores: candidates
            {70000, Fill::SampleHot},     // fewer than k keys above the threshold: streamed
            {3000, Fill::Random}},        // a one-CTA row in the same batch
           2048, 16, 2);
}

// Wider slices (TopKArgs::slice_keys): 8K / 12K (not dividing the rows) / 64K keys per CTA, the
// long rows' paths again (one slice per row at 64K).
TEST(TopKRadixEmu, LongRowsMatchCpuWithWideSlices) {
  for (int slice : {8192, 12288, tk::kMaxSliceKeys})
    run_case({{16385, Fill::Random},
              {20000, Fill::ExactTopBin},
              {18000, Fill::TiesAtCut},
              {30000, Fill::FewTies},
              {17000, Fill::FewUlps},
              {40000, Fill::TiesAtCut},
              {70000, Fill::SampleHot},
              {131072, Fill::HotRun},
              {3000, Fill::Random}},
             2048, 16, 4, slice);
}

// Smaller samples (TopKArgs::sample_lines: 64 and 128 lines instead of 256): the same sets, the
// candidate path on unstructured rows, the streamed one on rows built against the sample.
TEST(TopKRadixEmu, LongRowsMatchCpuWithSmallerSamples) {
  for (int lines : {64, 128})
    run_case({{16385, Fill::Random},
              {20000, Fill::ExactTopBin},
              {18000, Fill::TiesAtCut},
              {30000, Fill::FewTies},
              {40000, Fill::Random},
              {70000, Fill::SampleHot},
              {131072, Fill::HotRun},
              {131072, Fill::Random},
              {3000, Fill::Random}},
             2048, 16, 8, tk::kSliceKeys, 264, nullptr, lines);
}

// A row past kSharedBitmapKeys (512K keys): its selection bitmap in the workspace instead of
// shared memory, beside a row that uses the shared one.
TEST(TopKRadixEmu, RowsPastTheSharedBitmapMatchCpu) {
  static_assert(tk::kSharedBitmapKeys == 1 << 19, "indexer_test's TopKRowPastTheSharedBitmap builds a row past 1 << 19");
  run_case({{tk::kSharedBitmapKeys + 1000, Fill::Random}, {40000, Fill::TiesAtCut}}, 2048, 64, 9, tk::kMaxSliceKeys);
}

// Fewer gather CTAs than slices (each takes every G-th slice of its row): one CTA per row, and 3.
TEST(TopKRadixEmu, LongRowsMatchCpuWithFewerGatherCtasThanSlices) {
  for (int resident : {7, 21})  // 7 rows: G = 1, 3
    run_case({{16385, Fill::Random},
              {20000, Fill::ExactTopBin},
              {18000, Fill::TiesAtCut},
              {30000, Fill::FewTies},
              {70000, Fill::SampleHot},
              {131072, Fill::HotRun},
              {3000, Fill::Random}},
             2048, 16, 6, tk::kSliceKeys, resident);
}

// One workspace for calls of 1, 3, 7 and 2 rows (the runner's steps of different sizes): each
// call's layout puts its row states where another's candidates were.
TEST(TopKRadixEmu, WorkspaceSharedByCallsOfDifferentRowCounts) {
  const std::vector<Row> all = {{20000, Fill::Random},   {17000, Fill::TiesAtCut}, {30000, Fill::FewTies},
                                {18000, Fill::HotRun},   {16385, Fill::Random},    {17000, Fill::FewUlps},
                                {40000, Fill::Random}};
  std::vector<unsigned char> ws(tk::workspace_layout(int64_t(all.size()), 40000).total + 16, 0);
  uint64_t seed = 7;
  for (size_t n : {size_t(1), size_t(3), size_t(7), size_t(2)})
    run_case(std::vector<Row>(all.begin(), all.begin() + std::ptrdiff_t(n)), 2048, 16, seed++, tk::kSliceKeys, 264,
             &ws);
}

TEST(TopKRadixEmu, GatherCtasPerRowKeepOneWaveAndAtLeastOne) {
  EXPECT_EQ(tk::gather_ctas_per_row(1, 32, 264), 32);   // B 1 / 128K: a CTA per slice
  EXPECT_EQ(tk::gather_ctas_per_row(16, 32, 264), 16);  // 256 CTAs
  EXPECT_EQ(tk::gather_ctas_per_row(64, 32, 264), 4);
  EXPECT_EQ(tk::gather_ctas_per_row(256, 32, 264), 1);  // each CTA a whole row
  EXPECT_EQ(tk::gather_ctas_per_row(1000, 32, 264), 1);
  EXPECT_EQ(tk::gather_ctas_per_row(2, 5, 264), 5);  // at most one per slice
}

TEST(TopKRadixEmu, SliceChoiceKeepsRowsTimesSlicesWithinTheCtas) {
  EXPECT_EQ(tk::slice_keys_for(1, 131072, 264), 4096);      // 32 CTAs: plenty of room
  EXPECT_EQ(tk::slice_keys_for(8, 131072, 264), 4096);      // 256
  EXPECT_EQ(tk::slice_keys_for(64, 131072, 264), 32768);    // 4 slices: 256 CTAs
  EXPECT_EQ(tk::slice_keys_for(256, 32768, 264), 32768);    // 1 slice per row: 256
  EXPECT_EQ(tk::slice_keys_for(256, 131072, 264), 65536);   // capped: 512 CTAs
  EXPECT_EQ(tk::slice_keys_for(64, 32768, 264), 8192);      // 4 slices: 256
  for (int64_t rows : {1, 7, 64, 100, 256, 1000})
    for (int ctx : {16385, 40000, 131072, 1 << 20}) {
      const int s = tk::slice_keys_for(rows, ctx, 264);
      EXPECT_TRUE(tk::slice_keys_valid(s)) << rows << " x " << ctx;
      if (s < tk::kMaxSliceKeys) {
        EXPECT_LE(rows * ((ctx + s - 1) / s), 264) << rows << " x " << ctx;
      }
      if (s > tk::kSliceKeys) {  // the next smaller slice would not fit
        EXPECT_GT(rows * ((ctx + s - tk::kSliceKeys - 1) / (s - tk::kSliceKeys)), 264) << rows << " x " << ctx;
      }
    }
}

TEST(TopKRadixEmu, SampleTakesOneLineOfEachStrideWithinTheRow) {
  for (int max_lines : {32, 64, 256})
    for (int ctx : {16385, 40000, 131072, 1 << 22}) {
      const int stride = tk::sample_stride(ctx, max_lines), lines = (ctx + 31) / 32;
      EXPECT_LE((lines + stride - 1) / stride, max_lines) << ctx;
      for (int g = 0; g * stride < lines; ++g) {
        const int line = tk::sample_line(g, stride);
        EXPECT_GE(line, g * stride) << ctx;
        EXPECT_LT(line, (g + 1) * stride) << ctx;
      }
    }
  // The threshold's rank: above the sample's expected share of the top k.
  EXPECT_EQ(tk::sample_rank(2048, 16), 128 + 45 + 16);
  EXPECT_GT(tk::sample_rank(7, 16), 7 / 16);
}

// The largest k the API takes (kMaxTopK 4096): the sample's threshold still admits between k and
// kCandCap keys of an unstructured row (asserted in run_case), at 40K and 128K keys.
TEST(TopKRadixEmu, LargestKMatchesCpu) {
  run_case({{40000, Fill::Random}, {131072, Fill::Random}, {131072, Fill::HotRun}}, 4096, 64, 5, tk::kMaxSliceKeys);
}

TEST(TopKRadixEmu, SmallKMatchesCpu) {
  run_case({{40, Fill::Ties}, {17000, Fill::Random}, {17000, Fill::Ties}}, 7, 1, 3);
}

}  // namespace
}  // namespace fp4moe::test
