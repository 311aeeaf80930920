// The GPU DSA indexer against the CPU backend (cpu/attention/indexer_cpu.hpp):
//   - scores (BF16 keys; FP8 keys with the quantized query) per token against indexer_scores_cpu;
//   - top-k on the same scores: bit-identical to indexer_topk_cpu (same tie rule), incl. ties,
//     NaN, -inf, contexts 1 / k / k+1 / 100K, and the slot ids through the page table;
//   - the whole pipeline (GPU scores -> GPU top-k vs CPU scores -> CPU top-k): identical sets
//     wherever the k-th and (k+1)-th CPU scores differ by more than FP32 rounding;
//   - FP8 vs FP32 selection overlap on random data (bounded);
//   - bad input: unsupported head count / dims, page size, k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include "cpu/attention/indexer_cpu.hpp"
#include "format/codecs.hpp"
#include "cuda/attention_test_util.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/topk_flashinfer.hpp"
#include "cuda/indexer/topk_sample.hpp"

namespace fp4moe::test {
namespace {

namespace ix = cuda::indexer;
constexpr float kSoftmaxScale = 0.08838834764831845f;  // 128^-1/2

struct IndexerInputs {
  Bf16Data q;            // [T, 32, 128]
  std::vector<float> w;  // [T, 32]
};
IndexerInputs random_indexer_inputs(int64_t T, uint64_t seed) {
  IndexerInputs in;
  in.q = random_bf16(size_t(T) * kIndexHeads * kIndexDim, seed);
  in.w = random_floats(size_t(T) * kIndexHeads, seed + 1, -0.5f, 1.0f);
  return in;
}

std::vector<float> cpu_scores(PagedCase& c, const float* q, const float* w, int64_t stride) {
  std::vector<float> s(size_t(c.tokens() * stride));
  cpu::IndexerParams p;
  p.n_heads = kIndexHeads;
  p.softmax_scale = kSoftmaxScale;
  cpu::indexer_scores_cpu(c.layer(), c.batch(), q, w, p, s.data(), stride);
  return s;
}

// GPU scores; for FP8 keys the query is quantized on the GPU first and its decoded values and
// folded weights are returned in q_used / w_used (the exact inputs of the FP8 product).
std::vector<float> gpu_scores(PagedCase& c, const IndexerInputs& in, int64_t stride, std::vector<float>* q_used,
                              std::vector<float>* w_used, int tiles_per_cta = 0, int max_ctx = 0,
                              int tokens_per_cta = 0, int ring_stages = 0) {
  const int64_t T = c.tokens();
  DeviceCache dc(c);
  DeviceBatch db(c);
  DeviceArray<uint16_t> q(in.q.bits);
  DeviceArray<float> w(in.w), scores(size_t(T * stride));
  DeviceArray<uint8_t> q8(size_t(T) * kIndexHeads * kIndexDim);
  DeviceArray<float> w8(size_t(T) * kIndexHeads);
  ix::IndexerScoreArgs a;
  a.q = q.ptr;
  a.w = w.ptr;
  if (c.index_elem == KvElem::FP8_E4M3) {
    ix::quantize_q_fp8(q.ptr, w.ptr, q8.ptr, w8.ptr, T, nullptr);
    a.q = q8.ptr;
    a.w = w8.ptr;
    const auto codes = q8.download();
    q_used->resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) (*q_used)[i] = e4m3_to_float(codes[i]);
    *w_used = w8.download();
  } else {
    *q_used = in.q.f;
    *w_used = in.w;
  }
  a.layer = dc.L;
  a.batch = db.view();
  a.max_ctx = max_ctx > 0 ? max_ctx : c.max_ctx();
  a.scores = scores.ptr;
  a.score_stride = stride;
  a.tiles_per_cta = tiles_per_cta;
  a.tokens_per_cta = tokens_per_cta;
  a.ring_stages = ring_stages;
  ix::index_scores(a, nullptr);
  return scores.download();
}

// Worst per-token ‖gpu − cpu‖ / ‖cpu‖ over the causal columns.
double worst_score_error(const PagedCase& c, const std::vector<float>& g, const std::vector<float>& r,
                         int64_t stride) {
  double worst = 0;
  for (int64_t t = 0; t < c.tokens(); ++t) {
    double num = 0, den = 0;
    for (int64_t j = 0; j <= c.positions[size_t(t)]; ++j) {
      const double a = g[size_t(t * stride + j)], b = r[size_t(t * stride + j)];
      if (!std::isfinite(a)) return INFINITY;
      num += (a - b) * (a - b);
      den += b * b;
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// The top-k of case c's decode rows over scores [T, stride] (slots through its page table when
// `slot` is given), on a zeroed workspace of ws_bytes.
ix::TopKArgs topk_args(const PagedCase& c, const DeviceBatch& db, float* scores, int64_t stride, int k, int32_t* pos,
                       int32_t* slot, void* ws, size_t ws_bytes) {
  ix::TopKArgs a;
  a.scores = scores;
  a.score_stride = stride;
  a.batch = db.view();
  a.max_ctx = c.max_ctx();
  a.top_k = k;
  a.out_pos = pos;
  a.out_slot = slot;
  a.page_size = c.page_size;
  a.workspace = ws;
  a.workspace_bytes = ws_bytes;
  return a;
}

// Outputs poisoned (-7) first; run twice on one workspace (the kernels must leave it zeroed),
// the second result returned after checking it equals the first.
// shared_ws: a zeroed workspace of earlier calls, at least this call's size (nullptr: a fresh one).
int g_sample_lines = 0;  // TopKArgs::sample_lines of gpu_topk's calls
int g_one_cta_keys = 0;  // TopKArgs::one_cta_keys of gpu_topk's calls
std::vector<int32_t> gpu_topk(PagedCase& c, const std::vector<float>& scores, int64_t stride, int k,
                              std::vector<int32_t>* slots, int slice_keys = 0, DeviceArray<uint8_t>* shared_ws = nullptr) {
  DeviceBatch db(c);
  DeviceArray<float> s(scores);
  const std::vector<int32_t> poison(size_t(c.tokens() * k), -7);
  DeviceArray<int32_t> pos(poison), slot(poison);
  const size_t ws_bytes = shared_ws ? shared_ws->n : ix::top_k_workspace_bytes(c.tokens(), c.max_ctx());
  DeviceArray<uint8_t> own(shared_ws ? 1 : std::max<size_t>(ws_bytes, 1));
  DeviceArray<uint8_t>& ws = shared_ws ? *shared_ws : own;
  if (!shared_ws) FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr, 0, ws_bytes));
  ix::TopKArgs a = topk_args(c, db, s.ptr, stride, k, pos.ptr, slots ? slot.ptr : nullptr, ws.ptr, ws_bytes);
  a.slice_keys = slice_keys;
  a.sample_lines = g_sample_lines;
  a.one_cta_keys = g_one_cta_keys;
  ix::top_k(a, nullptr);
  const auto first = pos.download();
  ix::top_k(a, nullptr);
  const auto second = pos.download();
  EXPECT_EQ(first, second) << "a second call on the same workspace differs";
  if (shared_ws) {  // all of it zero again: the next call may lay it out for another row count
    const std::vector<uint8_t> w = shared_ws->download();
    EXPECT_EQ(std::count(w.begin(), w.end(), uint8_t(0)), std::ptrdiff_t(w.size())) << "the workspace is left non-zero";
  }
  if (slots) *slots = slot.download();
  return second;
}

std::vector<int32_t> cpu_topk(const PagedCase& c, const std::vector<float>& scores, int64_t stride, int k) {
  std::vector<int32_t> out(size_t(c.tokens() * k));
  cpu::indexer_topk_cpu(c.batch(), scores.data(), stride, k, out.data());
  return out;
}

const std::vector<RequestShape> kMixedShapes = {{1, 1}, {100, 1}, {2048, 1}, {2049, 1}, {5000, 1}, {3000, 3}};

void check_scores(int64_t page_size, KvElem index_elem, uint64_t seed, int tiles_per_cta = 0, int tokens_per_cta = 0,
                  int ring_stages = 0) {
  PagedCase c = make_paged_case(kMixedShapes, page_size, KvElem::BF16, index_elem, seed);
  const int64_t stride = c.max_ctx() + 5;
  const auto in = random_indexer_inputs(c.tokens(), seed + 7);
  std::vector<float> q_used, w_used;
  const auto g = gpu_scores(c, in, stride, &q_used, &w_used, tiles_per_cta, 0, tokens_per_cta, ring_stages);
  const auto r = cpu_scores(c, q_used.data(), w_used.data(), stride);
  // BF16: exact products, FP32 sums in another order. FP8: the tensor cores' FP8 accumulation
  // keeps fewer mantissa bits than FP32 (Hopper), hence the looser bound.
  const double tol = index_elem == KvElem::BF16 ? 1e-4 : 2e-3;
  EXPECT_LT(worst_score_error(c, g, r, stride), tol)
      << "page_size " << page_size << " " << kv_elem_name(index_elem) << " tiles_per_cta " << tiles_per_cta
      << " tokens_per_cta " << tokens_per_cta;
}

TEST(IndexerTiny, ScoresMatchCpuBf16) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int64_t ps : {1, 16, 64}) check_scores(ps, KvElem::BF16, 10 + uint64_t(ps));
}

TEST(IndexerTiny, ScoresMatchCpuFp8WithQuantizedQuery) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int64_t ps : {1, 64}) check_scores(ps, KvElem::FP8_E4M3, 20 + uint64_t(ps));
}

// The 2-stage ring (what a 99 KB-smem arch such as sm_120 runs), forced on this GPU.
TEST(IndexerTiny, ScoresMatchCpuWithTwoStageRing) {
  FP4MOE_SKIP_WITHOUT_GPU();
  check_scores(64, KvElem::BF16, 25, 0, 0, /*ring_stages=*/2);
  check_scores(16, KvElem::FP8_E4M3, 26, 0, 0, /*ring_stages=*/2);
}

// Splits of the keys over CTAs at both ends of the launcher's range and one between (the
// contexts of kMixedShapes end inside a CTA's range), against the CPU per token; the tiny
// suite, so under memcheck too.
TEST(IndexerTiny, ScoresMatchCpuWithOneThreeAndSixteenTilesPerCta) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int tiles : {1, 3, 16}) {
    check_scores(64, KvElem::BF16, 40 + uint64_t(tiles), tiles);
    check_scores(16, KvElem::FP8_E4M3, 60 + uint64_t(tiles), tiles);
  }
}

// Two query tokens per CTA (what a prefill chunk takes by default), forced on the mixed batch:
// pairs within a request ({3000, 3}) and across request boundaries, BF16 and FP8, two splits.
TEST(IndexerTiny, ScoresMatchCpuWithTwoTokensPerCta) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int tiles : {0, 3}) {
    check_scores(64, KvElem::BF16, 120 + uint64_t(tiles), tiles, 2);
    check_scores(16, KvElem::FP8_E4M3, 130 + uint64_t(tiles), tiles, 2);
  }
}

// A prefill chunk (one request, 1500 new tokens after 2000 cached): the default (two tokens per
// CTA) and one token per CTA forced, against the CPU.
TEST(Indexer, PrefillChunkScoresMatchCpuWithOneAndTwoTokensPerCta) {
  FP4MOE_SKIP_WITHOUT_GPU();
  PagedCase c = make_paged_case({{3500, 1500}}, 64, KvElem::BF16, KvElem::BF16, 140);
  const auto in = random_indexer_inputs(c.tokens(), 141);
  for (int g : {0, 1}) {
    std::vector<float> q_used, w_used;
    const auto s = gpu_scores(c, in, c.max_ctx(), &q_used, &w_used, 0, 0, g);
    EXPECT_LT(worst_score_error(c, s, cpu_scores(c, q_used.data(), w_used.data(), c.max_ctx()), c.max_ctx()), 1e-4)
        << "tokens_per_cta " << g;
  }
}

// Every split index_score_tiles_per_cta can pick (1..16 key tiles of 128 per CTA).
TEST(Indexer, ScoresMatchCpuAtEveryTilesPerCta) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int tiles = 1; tiles <= 16; ++tiles) {
    check_scores(64, KvElem::BF16, 80 + uint64_t(tiles), tiles);
    check_scores(1, KvElem::FP8_E4M3, 100 + uint64_t(tiles), tiles);
  }
}

// A grid sized for a far longer context than the rows have (what a decode graph captured at the
// largest context replays): each token's CTAs split its own length, and every key is covered.
TEST(IndexerTiny, ScoresMatchCpuWhenTheGridIsSizedForAFarLongerContext) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    PagedCase c = make_paged_case(kMixedShapes, 64, KvElem::BF16, e, 50);
    const int max_ctx = 131072;
    const auto in = random_indexer_inputs(c.tokens(), 51);
    std::vector<float> q_used, w_used;
    const auto g = gpu_scores(c, in, max_ctx, &q_used, &w_used, 0, max_ctx);
    const auto r = cpu_scores(c, q_used.data(), w_used.data(), max_ctx);
    EXPECT_LT(worst_score_error(c, g, r, max_ctx), e == KvElem::BF16 ? 1e-4 : 2e-3) << kv_elem_name(e);
  }
}

TEST(Indexer, ScoresMatchCpuAtContext100K) {
  FP4MOE_SKIP_WITHOUT_GPU();
  PagedCase c = make_paged_case({{100000, 1}, {1, 1}, {777, 2}}, 64, KvElem::BF16, KvElem::BF16, 30);
  const int64_t stride = c.max_ctx();
  const auto in = random_indexer_inputs(c.tokens(), 31);
  std::vector<float> q_used, w_used;
  const auto g = gpu_scores(c, in, stride, &q_used, &w_used);
  EXPECT_LT(worst_score_error(c, g, cpu_scores(c, q_used.data(), w_used.data(), stride), stride), 1e-4);
}

// The query's interleaved RoPE and the BF16 head weights fused into the score kernel
// (IndexerScoreArgs::q_rope_*, w_bf16): against the CPU scores of the host-rotated query (each
// pair rotated in FP32 and rounded to BF16, as a RoPE launch stores it) and the weights
// bf16 -> FP32 x scale. Tolerance 1e-3 (not 1e-4): the device's cosf / sinf may differ from the
// host's by an ulp, which can move a rotated value by one BF16 step.
TEST(Indexer, ScoresWithTheQueryRopeAndBf16WeightsFusedMatchCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  PagedCase c = make_paged_case({{5000, 1}, {1, 1}, {777, 3}, {40000, 1}}, 64, KvElem::BF16, KvElem::BF16, 33);
  const int64_t T = c.tokens(), stride = c.max_ctx();
  const int rope_dim = 64;
  const float af = 1.1f, w_scale = 1.0f / std::sqrt(32.0f);
  std::vector<float> inv_freq;
  for (int i = 0; i < rope_dim / 2; ++i) inv_freq.push_back(float(1.0 / std::pow(10000.0, 2.0 * i / rope_dim)));
  const Bf16Data q = random_bf16(size_t(T) * kIndexHeads * kIndexDim, 34);
  const Bf16Data wb = random_bf16(size_t(T) * kIndexHeads, 35);
  std::vector<float> q_rot = q.f, w_used(wb.f.size());
  rope_index_queries_like_a_launch(q_rot, c.positions, inv_freq, af);
  for (size_t i = 0; i < w_used.size(); ++i) w_used[i] = wb.f[i] * w_scale;
  DeviceCache dc(c);
  DeviceBatch db(c);
  DeviceArray<uint16_t> dq(q.bits), dw(wb.bits);
  DeviceArray<float> dfreq(inv_freq), scores(size_t(T * stride));
  ix::IndexerScoreArgs a;
  a.q = dq.ptr;
  a.w_bf16 = dw.ptr;
  a.w_bf16_scale = w_scale;
  a.q_rope_inv_freq = dfreq.ptr;
  a.q_rope_dim = rope_dim;
  a.q_rope_attn_factor = af;
  a.layer = dc.L;
  a.batch = db.view();
  a.max_ctx = c.max_ctx();
  a.scores = scores.ptr;
  a.score_stride = stride;
  ix::index_scores(a, nullptr);
  EXPECT_LT(worst_score_error(c, scores.download(), cpu_scores(c, q_rot.data(), w_used.data(), stride), stride), 1e-3);
}

// Scores with many exact ties (few distinct values), NaN and -inf entries.
std::vector<float> tie_heavy_scores(const PagedCase& c, int64_t stride, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> s(size_t(c.tokens() * stride), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int64_t j = 0; j <= c.positions[size_t(t)]; ++j) {
      const uint64_t u = g() % 100;
      float v = float(int(g() % 7)) * 0.5f - 1.0f;  // 7 values incl. 0 and negatives
      if (u == 0) v = std::numeric_limits<float>::quiet_NaN();
      if (u == 1) v = -std::numeric_limits<float>::infinity();
      if (u == 2) v = -0.0f;
      s[size_t(t * stride + j)] = v;
    }
  return s;
}

void check_topk_exact(const std::vector<RequestShape>& shapes, int64_t page_size, int k, bool ties, uint64_t seed) {
  PagedCase c = make_paged_case(shapes, page_size, KvElem::BF16, KvElem::BF16, seed, /*fill=*/false);
  const int64_t stride = c.max_ctx() + 3;
  std::vector<float> s = ties ? tie_heavy_scores(c, stride, seed) : random_floats(size_t(c.tokens() * stride), seed, -3, 3);
  std::vector<int32_t> slots;
  const auto g = gpu_topk(c, s, stride, k, &slots);
  const auto r = cpu_topk(c, s, stride, k);
  ASSERT_EQ(g, r) << "k " << k << " page_size " << page_size << (ties ? " (ties)" : "");
  const KvBatchView b = c.batch();
  std::vector<int32_t> req(size_t(c.tokens()));
  kv_token_requests(b, req.data());
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int i = 0; i < k; ++i) {
      const int32_t p = r[size_t(t * k + i)];
      const int32_t want = p < 0 ? -1 : int32_t(kv_slot(b, page_size, req[size_t(t)], p));
      ASSERT_EQ(slots[size_t(t * k + i)], want) << "token " << t << " entry " << i;
    }
}

TEST(IndexerTiny, TopKIdenticalToCpuSmallK) {
  FP4MOE_SKIP_WITHOUT_GPU();
  check_topk_exact({{1, 1}, {5, 1}, {6, 1}, {300, 4}}, 16, 5, false, 40);
  check_topk_exact({{1, 1}, {5, 1}, {6, 1}, {300, 4}}, 16, 5, true, 41);
}

// -0 and +0 compare equal: a cut that falls among zeros of both signs takes the lowest
// positions, whatever their sign (the CPU rule; the radix key must not order -0 below +0).
TEST(IndexerTiny, TopKTreatsSignedZerosAsTies) {
  FP4MOE_SKIP_WITHOUT_GPU();
  PagedCase c = make_paged_case({{300, 1}, {4000, 1}}, 16, KvElem::BF16, KvElem::BF16, 45, /*fill=*/false);
  const int64_t stride = c.max_ctx();
  std::vector<float> s(size_t(c.tokens() * stride), 0.f);
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int64_t j = 0; j < stride; ++j) {
      float v = (j % 3 == 0) ? -0.0f : 0.0f;  // zeros of both signs, the -0 ones first at j = 0
      if (j % 17 == 5) v = 1.0f;               // a few clear winners
      if (j % 13 == 7) v = -1.0f;
      s[size_t(t * stride + j)] = v;
    }
  for (int k : {5, 40, 2048}) {
    const auto g = gpu_topk(c, s, stride, k, nullptr);
    EXPECT_EQ(g, cpu_topk(c, s, stride, k)) << "k " << k;
  }
}

TEST(Indexer, TopKIdenticalToCpuK2048) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (bool ties : {false, true}) {
    check_topk_exact(kMixedShapes, 64, 2048, ties, 50 + ties);
    check_topk_exact({{100000, 1}, {1, 1}, {4096, 2}}, 1, 2048, ties, 52 + ties);
  }
}

// Rows across the one-CTA / multi-CTA boundary and every path of the long-row kernels
// (candidates resolved at the first digit, with a position cut among equal keys; streamed
// when the candidates overflow, or when the sampled lines alone score high and the sample's
// threshold admits fewer than k keys); tests/cuda/topk_radix_emu_test.cpp runs the same
// kernels on the CPU.
void check_topk_long_rows(const std::vector<RequestShape>& shapes, uint64_t seed, int slice_keys = 0,
                          DeviceArray<uint8_t>* shared_ws = nullptr) {
  PagedCase c = make_paged_case(shapes, 16, KvElem::BF16, KvElem::BF16, seed, /*fill=*/false);
  const int64_t stride = c.max_ctx() + 1;
  const int k = 2048;
  std::mt19937_64 g(seed + 1);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> s(size_t(c.tokens() * stride), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const int64_t n = c.positions[size_t(t)] + 1;
    float* r = &s[size_t(t * stride)];
    for (int64_t j = 0; j < n; ++j) r[j] = u(g);
    if (n <= 16384) continue;  // one-CTA rows: random
    const int64_t kind = t % 5;
    if (kind == 1)  // exactly k keys in the top first-digit bin
      for (int i = 0; i < k; ++i) r[(int64_t(i) * 7919) % n] = 100.0f + float(i % 5) * 0.5f;
    if (kind == 2)  // k / 2 winners, then 2000 equal keys across the cut
      for (int i = 0; i < k / 2 + 2000; ++i) r[(int64_t(i) * 7919) % n] = i < k / 2 ? 50.0f : 10.0f;
    if (kind == 3)  // 3 values: ~n / 3 equal keys at the top (> 8192: more than the candidate list holds)
      for (int64_t j = 0; j < n; ++j) r[j] = float(int(g() % 3));
    if (kind == 4) {  // exactly the sampled lines score high: fewer than k candidates
      const int sstride = ix::topk::sample_stride(int(n), g_sample_lines > 0 ? g_sample_lines : ix::topk::kSampleLines);
      for (int gi = 0; int64_t(gi) * sstride * 32 < n; ++gi)
        for (int64_t j = int64_t(ix::topk::sample_line(gi, sstride)) * 32, e = j + 32; j < e && j < n; ++j) r[j] += 20.0f;
    }
  }
  std::vector<int32_t> slots;
  const auto got = gpu_topk(c, s, stride, k, &slots, slice_keys, shared_ws);
  ASSERT_EQ(got, cpu_topk(c, s, stride, k)) << "slice_keys " << slice_keys;
  const KvBatchView b = c.batch();
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int i = 0; i < k; ++i) {
      const int32_t p = got[size_t(t * k + i)];
      ASSERT_EQ(slots[size_t(t * k + i)], p < 0 ? -1 : int32_t(kv_slot(b, c.page_size, t, p)));
    }
}

TEST(IndexerTiny, TopKLongRowPathsIdenticalToCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  // rows 0..3: random (candidates), exact top bin, ties across the cut, 3 values (candidates)
  check_topk_long_rows({{16385, 1}, {17000, 1}, {17000, 1}, {17000, 1}, {3000, 1}}, 80);
}

TEST(Indexer, TopKLongRowPathsIdenticalToCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  // 40000: 3 values (> 8192 candidates: streamed); 16385: the sampled lines high (streamed); 16384 / 16385: the boundary
  check_topk_long_rows({{16384, 1}, {20000, 1}, {24000, 1}, {40000, 1}, {16385, 1}, {131072, 1}, {100000, 1}}, 82);
}

// Smaller samples (TopKArgs::sample_lines 64 / 128): the same sets on every path.
TEST(Indexer, TopKLongRowPathsIdenticalToCpuWithSmallerSamples) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int lines : {64, 128}) {
    g_sample_lines = lines;
    check_topk_long_rows({{16384, 1}, {20000, 1}, {24000, 1}, {40000, 1}, {16385, 1}, {131072, 1}, {100000, 1}},
                         86 + uint64_t(lines));
  }
  g_sample_lines = 0;
}

// One CTA for rows up to 32K keys (TopKArgs::one_cta_keys 32768, where a block may have 145 KB of
// shared memory): the same sets on every path, the sampled path for the longer rows beside them.
TEST(Indexer, TopKOneCtaRowsUpTo32KIdenticalToCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  if (ix::top_k_max_one_cta_keys() < 32768) GTEST_SKIP() << "needs 145 KB of shared memory per block";
  g_one_cta_keys = 32768;
  check_topk_long_rows({{16384, 1}, {20000, 1}, {24000, 1}, {32768, 1}, {16385, 1}, {131072, 1}, {40000, 1}}, 89);
  g_one_cta_keys = 0;
}

// A row past 512K keys marks its selection in the workspace's bitmap, a shorter one beside it in
// shared memory.
TEST(Indexer, TopKRowPastTheSharedBitmapIdenticalToCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  check_topk_long_rows({{(1 << 19) + 1000, 1}, {40000, 1}}, 88);  // topk_radix.cuh's kSharedBitmapKeys: 512K
}

// One workspace for calls of 1, 3, 6 and 2 rows (the runner's steps of different sizes): a call's
// row states lie where an earlier call's candidates were.
TEST(Indexer, TopKWorkspaceSharedByCallsOfGrowingRowCounts) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::vector<RequestShape> all = {{20000, 1}, {17000, 1}, {24000, 1}, {40000, 1}, {16385, 1}, {30000, 1}};
  const size_t bytes = ix::top_k_workspace_bytes(int64_t(all.size()), 40000);
  DeviceArray<uint8_t> ws(bytes);
  FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr, 0, bytes));
  uint64_t seed = 90;
  for (size_t n : {size_t(1), size_t(3), size_t(6), size_t(2)})
    check_topk_long_rows(std::vector<RequestShape>(all.begin(), all.begin() + std::ptrdiff_t(n)), seed++, 0, &ws);
}

// Wider slices (TopKArgs::slice_keys, what top_k_slice_keys picks for many long rows): the same
// rows, one CTA per 8K / 12K / 64K keys (12K: slices that do not divide the rows).
TEST(IndexerTiny, TopKLongRowPathsIdenticalToCpuWithWideSlices) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int slice : {8192, 12288, 65536})
    check_topk_long_rows({{16385, 1}, {17000, 1}, {17000, 1}, {17000, 1}, {3000, 1}}, 80, slice);
}

TEST(Indexer, TopKLongRowPathsIdenticalToCpuWithWideSlices) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int slice : {12288, 32768, 65536})
    check_topk_long_rows({{16384, 1}, {20000, 1}, {24000, 1}, {40000, 1}, {16385, 1}, {131072, 1}, {100000, 1}}, 82,
                         slice);
}

#if defined(FP4MOE_HAVE_FLASHINFER)
// FlashInfer's DSA top-k through our wrapper (topk_flashinfer.hpp; `bench attention`'s baseline):
// per decode row the CPU's set (random scores: no ties at the cut; its order is its own), each
// position's cache slot through the shuffled page table, -1 padding for a row of <= k keys.
TEST(Indexer, FlashInferTopKSelectsTheCpuSetWithItsSlots) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int k = 2048;
  PagedCase c = make_paged_case({{40000, 1}, {131072, 1}, {20000, 1}, {3000, 1}, {1000, 1}}, 64, KvElem::BF16,
                                KvElem::BF16, 95, /*fill=*/false);
  const int64_t stride = c.max_ctx() + 4;
  std::mt19937_64 g(96);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> s(size_t(c.tokens() * stride), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int64_t j = 0; j <= c.positions[size_t(t)]; ++j) s[size_t(t * stride + j)] = u(g);
  DeviceBatch db(c);
  DeviceArray<float> ds(s);
  const std::vector<int32_t> poison(size_t(c.tokens() * k), -7);
  DeviceArray<int32_t> pos(poison), slot(poison);
  DeviceArray<uint8_t> ws(ix::flashinfer_top_k_workspace_bytes());
  FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr, 0, ix::flashinfer_top_k_workspace_bytes()));
  ix::FlashInferTopKArgs a;
  a.scores = ds.ptr;
  a.score_stride = stride;
  a.rows = c.tokens();
  a.lengths = db.view().kv_len;  // one token per request
  a.page_starts = db.view().page_indptr;
  a.page_indices = db.view().page_indices;
  a.page_size = int(c.page_size);
  a.max_ctx = c.max_ctx();
  a.top_k = k;
  a.out_pos = pos.ptr;
  a.out_slot = slot.ptr;
  a.workspace = ws.ptr;
  a.workspace_bytes = ix::flashinfer_top_k_workspace_bytes();
  if (const std::string why = ix::flashinfer_top_k_can_implement(a); !why.empty()) GTEST_SKIP() << why;
  ix::flashinfer_top_k(a, nullptr);
  const auto got_pos = pos.download(), got_slot = slot.download(), want = cpu_topk(c, s, stride, k);
  const KvBatchView b = c.batch();
  for (int64_t t = 0; t < c.tokens(); ++t) {
    std::vector<int32_t> gp(got_pos.begin() + t * k, got_pos.begin() + (t + 1) * k),
        wp(want.begin() + t * k, want.begin() + (t + 1) * k);
    for (int i = 0; i < k; ++i) {
      const int32_t p = gp[size_t(i)];
      ASSERT_EQ(got_slot[size_t(t * k + i)], p < 0 ? -1 : int32_t(kv_slot(b, c.page_size, t, p))) << "row " << t;
    }
    std::sort(gp.begin(), gp.end());
    std::sort(wp.begin(), wp.end());
    EXPECT_EQ(gp, wp) << "row " << t << " (" << c.positions[size_t(t)] + 1 << " keys)";
  }
}
#endif

TEST(Indexer, PipelineSelectsCpuSetWhereScoresAreSeparated) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int k = 2048;
  PagedCase c = make_paged_case({{2049, 1}, {9000, 1}, {40000, 1}, {3000, 2}}, 64, KvElem::BF16, KvElem::BF16, 60);
  const int64_t stride = c.max_ctx();
  const auto in = random_indexer_inputs(c.tokens(), 61);
  std::vector<float> qu, wu;
  const auto gs = gpu_scores(c, in, stride, &qu, &wu);
  const auto cs = cpu_scores(c, qu.data(), wu.data(), stride);
  const auto g = gpu_topk(c, gs, stride, k, nullptr);
  const auto r = cpu_topk(c, cs, stride, k);
  int compared = 0;
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const int64_t n = c.positions[size_t(t)] + 1;
    if (n <= k) continue;
    // delta: how far the GPU's FP32 scores of this row stray from the CPU's (summation order).
    // If the CPU's k-th and (k+1)-th scores are more than 2 delta apart, no score can cross
    // the cut on the GPU, so the sets must be identical.
    double delta = 0;
    for (int64_t j = 0; j < n; ++j)
      delta = std::max(delta, double(std::fabs(gs[size_t(t * stride + j)] - cs[size_t(t * stride + j)])));
    std::vector<float> row(cs.begin() + t * stride, cs.begin() + t * stride + n);
    std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<>());
    const float kth = *std::min_element(row.begin(), row.begin() + k), next = row[size_t(k)];
    if (double(kth) - double(next) <= 2 * delta) continue;
    ++compared;
    EXPECT_TRUE(std::equal(g.begin() + t * k, g.begin() + (t + 1) * k, r.begin() + t * k))
        << "token " << t << " (gap " << kth - next << ", delta " << delta << ")";
  }
  EXPECT_GT(compared, 0) << "no token had separated k-th / (k+1)-th scores";
}

// Programmatic dependent launch (IndexerScoreArgs::pdl, TopKArgs::pdl): scores -> sample ->
// gather, each kernel launched while the one before may still run, on a stream and as a CUDA
// graph replayed several times: the scores, positions and slots bit-identical to plain launches.
TEST(Indexer, ScoresAndTopKWithProgrammaticLaunchIdenticalToPlain) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int k = 2048;
  PagedCase c = make_paged_case({{40000, 1}, {9000, 1}, {70000, 1}, {3000, 2}}, 64, KvElem::BF16, KvElem::BF16, 62);
  const int64_t T = c.tokens(), stride = c.max_ctx();
  const auto in = random_indexer_inputs(T, 63);
  DeviceCache dc(c);
  DeviceBatch db(c);
  DeviceArray<uint16_t> q(in.q.bits);
  DeviceArray<float> w(in.w);
  const size_t ws_bytes = ix::top_k_workspace_bytes(T, c.max_ctx());
  DeviceArray<uint8_t> ws(ws_bytes);
  FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr, 0, ws_bytes));
  struct Out {
    std::vector<float> scores;
    std::vector<int32_t> pos, slot;
  };
  auto run = [&](bool pdl, bool graph) {
    DeviceArray<float> scores(std::vector<float>(size_t(T * stride), -7.0f));
    DeviceArray<int32_t> pos(std::vector<int32_t>(size_t(T) * k, -7)), slot(std::vector<int32_t>(size_t(T) * k, -7));
    ix::IndexerScoreArgs a;
    a.q = q.ptr;
    a.w = w.ptr;
    a.layer = dc.L;
    a.batch = db.view();
    a.max_ctx = c.max_ctx();
    a.scores = scores.ptr;
    a.score_stride = stride;
    a.pdl = pdl;
    ix::TopKArgs t = topk_args(c, db, scores.ptr, stride, k, pos.ptr, slot.ptr, ws.ptr, ws_bytes);
    t.pdl = pdl;
    cudaStream_t s;
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!graph) {
      for (int i = 0; i < 3; ++i) ix::index_scores(a, s), ix::top_k(t, s);
    } else {
      cudaGraph_t g;
      cudaGraphExec_t e;
      FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      ix::index_scores(a, s);
      ix::top_k(t, s);
      FP4MOE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
      for (int i = 0; i < 3; ++i) FP4MOE_CUDA_CHECK(cudaGraphLaunch(e, s));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
      FP4MOE_CUDA_CHECK(cudaGraphExecDestroy(e));
      FP4MOE_CUDA_CHECK(cudaGraphDestroy(g));
    }
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
    FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
    return Out{scores.download(), pos.download(), slot.download()};
  };
  const Out plain = run(false, false);
  for (const bool graph : {false, true}) {
    const Out o = run(true, graph);
    EXPECT_EQ(std::memcmp(o.scores.data(), plain.scores.data(), o.scores.size() * 4), 0) << "graph " << graph;
    EXPECT_EQ(o.pos, plain.pos) << "graph " << graph;
    EXPECT_EQ(o.slot, plain.slot) << "graph " << graph;
  }
  const std::vector<uint8_t> left = ws.download();
  EXPECT_EQ(std::count(left.begin(), left.end(), uint8_t(0)), std::ptrdiff_t(left.size())) << "workspace left non-zero";
}

TEST(Indexer, Fp8SelectionOverlapsFp32OnRandomData) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int k = 2048;
  PagedCase c32 = make_paged_case({{16384, 1}, {32768, 1}}, 64, KvElem::BF16, KvElem::BF16, 70);
  PagedCase c8 = make_paged_case({{16384, 1}, {32768, 1}}, 64, KvElem::BF16, KvElem::FP8_E4M3, 70);
  const int64_t stride = c32.max_ctx();
  const auto in = random_indexer_inputs(c32.tokens(), 71);
  std::vector<float> qu, wu;
  const auto r = cpu_topk(c32, cpu_scores(c32, in.q.f.data(), in.w.data(), stride), stride, k);
  const auto g = gpu_topk(c8, gpu_scores(c8, in, stride, &qu, &wu), stride, k, nullptr);
  for (int64_t t = 0; t < c32.tokens(); ++t) {
    std::set<int32_t> a(r.begin() + t * k, r.begin() + (t + 1) * k), b(g.begin() + t * k, g.begin() + (t + 1) * k);
    int common = 0;
    for (int32_t x : a) common += int(b.count(x));
    const double overlap = double(common) / k;
    std::printf("token %lld: FP8 selection keeps %.2f %% of the FP32 set\n", static_cast<long long>(t), 100 * overlap);
    EXPECT_GT(overlap, 0.8) << "token " << t;
  }
}

TEST(Indexer, DefaultTilesPerCtaIsWithinOneToSixteenAndGrowsWithTheBatch) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    int prev = 0;
    for (int64_t B : {1, 4, 16, 64, 256}) {
      const int t = ix::index_score_tiles_per_cta(B, 131072, e);
      EXPECT_GE(t, std::max(prev, 1)) << B;
      EXPECT_LE(t, 16) << B;
      prev = t;
    }
    EXPECT_EQ(ix::index_score_tiles_per_cta(1, 1000, e), 1);
    EXPECT_EQ(ix::index_score_tiles_per_cta(256, 131072, e), 16);
  }
}

TEST(IndexerErrors, TilesTokensPerCtaOrRingStagesOutsideRangeIsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  PagedCase c = make_paged_case({{300, 1}}, 64, KvElem::BF16, KvElem::BF16, 3);
  const auto in = random_indexer_inputs(c.tokens(), 4);
  std::vector<float> qu, wu;
  EXPECT_THROW(gpu_scores(c, in, c.max_ctx(), &qu, &wu, 17), Error);
  EXPECT_THROW(gpu_scores(c, in, c.max_ctx(), &qu, &wu, -1), Error);
  EXPECT_THROW(gpu_scores(c, in, c.max_ctx(), &qu, &wu, 0, 0, 3), Error);     // tokens_per_cta
  EXPECT_THROW(gpu_scores(c, in, c.max_ctx(), &qu, &wu, 0, 0, 0, 3), Error);  // ring_stages
}

TEST(IndexerErrors, UnsupportedHeadCountIsAnError) {
  EXPECT_NE(ix::indexer_can_implement(64, 128).find("unsupported"), std::string::npos);
  EXPECT_NE(ix::indexer_can_implement(32, 64).find("unsupported"), std::string::npos);
  EXPECT_EQ(ix::indexer_can_implement(32, 128), "");
}

// One request of ctx keys, its scores (stride keys) and out_n output entries on the device, and
// top-k args over them (no workspace); the args point into the members, so it stays in place.
struct OneRowTopK {
  PagedCase c;
  DeviceBatch db;
  DeviceArray<float> s;
  DeviceArray<int32_t> out;
  ix::TopKArgs a;
  OneRowTopK(int ctx, int64_t stride, size_t out_n, int k)
      : c(make_paged_case({{ctx, 1}}, 64, KvElem::BF16, KvElem::BF16, 1, false)), db(c), s(size_t(stride)), out(out_n) {
    a.scores = s.ptr;
    a.score_stride = stride;
    a.batch = db.view();
    a.max_ctx = ctx;
    a.out_pos = out.ptr;
    a.top_k = k;
  }
  OneRowTopK(const OneRowTopK&) = delete;
  OneRowTopK& operator=(const OneRowTopK&) = delete;
};

TEST(IndexerErrors, TopKOutsideRangeIsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  OneRowTopK t(10, 16, size_t(ix::kMaxTopK + 1), ix::kMaxTopK + 1);
  EXPECT_THROW(ix::top_k(t.a, nullptr), Error);
  t.a.top_k = 0;
  EXPECT_THROW(ix::top_k(t.a, nullptr), Error);
}

TEST(IndexerErrors, TopKLongRowsWithoutWorkspaceIsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  OneRowTopK t(20000, 20000, 2048, 2048);
  EXPECT_THROW(ix::top_k(t.a, nullptr), Error);  // no workspace
  t.a.max_ctx = 20001;
  EXPECT_THROW(ix::top_k(t.a, nullptr), Error);  // score rows shorter than max_ctx
}

TEST(IndexerErrors, TopKOneCtaKeysOtherThan16KOr32KIsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  OneRowTopK t(20000, 20000, 2048, 2048);
  for (int bad : {-1, 8192, 20000, 65536}) {
    t.a.one_cta_keys = bad;
    EXPECT_THROW(ix::top_k(t.a, nullptr), Error) << bad;
  }
}

TEST(IndexerErrors, TopKSliceNotAMultipleOf4096IsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  OneRowTopK t(20000, 20000, 2048, 2048);
  for (int bad : {1000, 4097, 2 * 65536}) {
    t.a.slice_keys = bad;
    EXPECT_THROW(ix::top_k(t.a, nullptr), Error) << bad;
  }
}

TEST(IndexerErrors, TopKSampleLinesOutsideRangeIsAnError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  OneRowTopK t(20000, 20000, 2048, 2048);
  for (int bad : {-1, 31, 257}) {
    t.a.sample_lines = bad;
    EXPECT_THROW(ix::top_k(t.a, nullptr), Error) << bad;
  }
}

}  // namespace
}  // namespace fp4moe::test
