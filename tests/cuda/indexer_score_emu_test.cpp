// The indexer's score kernel (cuda/indexer/indexer_score_mma.cuh) on the CPU through the CUDA
// emulator, against cpu/attention/indexer_cpu.hpp per token: BF16 and FP8 E4M3 keys (E4M3
// queries), the 3- and 2-stage rings, page sizes 1 / 16 / 64, fixed splits and the per-token one
// under a grid sized for a far longer context, and the fused query RoPE with BF16 head weights.
// Needs no GPU (runs in CI); indexer_test runs the kernel on the device.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/indexer/indexer_score_mma.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "cpu/attention/indexer_cpu.hpp"
#include "cuda/attention_case.hpp"
#include "format/codecs.hpp"

namespace fp4moe::test {
namespace {

namespace sc = cuda::indexer::score;

struct Config {
  int tiles_per_cta = 0;  // 0: the per-token split
  int max_ctx = 0;        // the grid's context (0: the batch's)
  int resident = 264;
  bool two_stages = false;
  bool rope = false;  // BF16 only: the fused query RoPE and BF16 weights
  int group = 1;      // query tokens per CTA
};

// Worst per-token ||gpu - cpu|| / ||cpu|| over the causal columns; a column past a token's
// context must keep its poison.
double worst_error(const PagedCase& c, const std::vector<float>& g, const std::vector<float>& r, int64_t stride) {
  double worst = 0;
  for (int64_t t = 0; t < c.tokens(); ++t) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < stride; ++j) {
      const float a = g[size_t(t * stride + j)];
      if (j > c.positions[size_t(t)]) {
        if (!std::isnan(a)) return INFINITY;  // written past the context
        continue;
      }
      const double b = r[size_t(t * stride + j)];
      if (!std::isfinite(a)) return INFINITY;
      num += (a - b) * (a - b);
      den += b * b;
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

template <bool kFp8, int kStages>
void launch(const sc::ScoreParams& p, int group, int grid_x, int grid_y) {
  const dim3 grid{unsigned(grid_x), unsigned(grid_y), 1u};
  if (group == 2)
    emu::launch(grid, dim3(sc::kThreads), sc::Tile<kFp8, kStages>::kSmemBytes, sc::index_score_kernel<kFp8, kStages, 2>, p);
  else
    emu::launch(grid, dim3(sc::kThreads), sc::Tile<kFp8, kStages>::kSmemBytes, sc::index_score_kernel<kFp8, kStages, 1>, p);
}

double run(const std::vector<RequestShape>& shapes, int64_t page_size, KvElem index_elem, const Config& cfg,
           uint64_t seed) {
  PagedCase c = make_paged_case(shapes, page_size, KvElem::BF16, index_elem, seed);
  const bool fp8 = index_elem == KvElem::FP8_E4M3;
  const int64_t T = c.tokens();
  const int max_ctx = cfg.max_ctx > 0 ? cfg.max_ctx : c.max_ctx();
  const int64_t stride = max_ctx + 3;
  std::mt19937_64 g(seed + 100);
  // Queries: BF16 (RoPE'd on the host for the reference when fused) or E4M3 codes; weights.
  const size_t nq = size_t(T) * kIndexHeads * kIndexDim;
  std::vector<uint8_t> q_bytes(nq * (fp8 ? 1 : 2));
  std::vector<float> q_ref(nq), w(size_t(T) * kIndexHeads), w_ref(w.size());
  std::vector<uint16_t> w16(w.size());
  std::uniform_real_distribution<float> uw(-0.5f, 1.0f);
  for (size_t i = 0; i < w.size(); ++i) {
    w16[i] = float_to_bf16(uw(g));
    w[i] = bf16_to_float(w16[i]);
  }
  if (fp8) {
    for (size_t i = 0; i < nq; ++i) {
      q_bytes[i] = uint8_t(g() % 256);
      if ((q_bytes[i] & 0x7f) == 0x7f) q_bytes[i] = 0x30;  // no NaN codes
      q_ref[i] = e4m3_to_float(q_bytes[i]);
    }
  } else {
    const Bf16Data q = random_bf16(nq, seed + 101);
    std::memcpy(q_bytes.data(), q.bits.data(), nq * 2);
    q_ref = q.f;
  }
  const int rope_dim = 64;
  const float af = 1.1f, w_scale = 1.0f / std::sqrt(32.0f);
  std::vector<float> inv_freq;
  for (int i = 0; i < rope_dim / 2; ++i) inv_freq.push_back(float(1.0 / std::pow(10000.0, 2.0 * i / rope_dim)));
  if (cfg.rope) {
    rope_index_queries_like_a_launch(q_ref, c.positions, inv_freq, af);
    for (size_t i = 0; i < w.size(); ++i) w_ref[i] = w[i] * w_scale;
  } else {
    w_ref = w;
  }
  std::vector<float> scores(size_t(T * stride), std::numeric_limits<float>::quiet_NaN());
  sc::ScoreParams p{};
  p.q = q_bytes.data();
  p.w = w.data();
  p.keys = c.index_k.data();
  p.qo_indptr = c.qo_indptr.data();
  p.positions = c.positions.data();
  p.page_indptr = c.page_indptr.data();
  p.page_indices = c.page_indices.data();
  p.num_requests = int(c.kv_len.size());
  p.num_tokens = int(T);
  p.scores = scores.data();
  p.score_stride = stride;
  p.page_shift = __builtin_ctzll(uint64_t(page_size));
  p.tiles_per_cta = cfg.tiles_per_cta;
  p.resident = cfg.resident;
  p.scale = 1.0f / std::sqrt(float(kIndexDim)) * (fp8 ? c.index_scale : 1.0f);
  if (cfg.rope) {
    p.rope_inv_freq = inv_freq.data();
    p.rope_dim = rope_dim;
    p.rope_attn_factor = af;
    p.w_bf16 = w16.data();
    p.w_scale = w_scale;
  }
  const int key_tiles = (max_ctx + sc::kTileKeys - 1) / sc::kTileKeys;
  const int groups = int((T + cfg.group - 1) / cfg.group);
  const int per = cfg.tiles_per_cta > 0 ? cfg.tiles_per_cta : sc::tiles_per_cta_for(groups, max_ctx, cfg.resident);
  const int gy = (key_tiles + per - 1) / per;
  if (fp8) cfg.two_stages ? launch<true, 2>(p, cfg.group, groups, gy) : launch<true, 3>(p, cfg.group, groups, gy);
  else cfg.two_stages ? launch<false, 2>(p, cfg.group, groups, gy) : launch<false, 3>(p, cfg.group, groups, gy);

  std::vector<float> ref(size_t(T * stride));
  cpu::IndexerParams ip;
  ip.n_heads = kIndexHeads;
  ip.softmax_scale = 1.0f / std::sqrt(float(kIndexDim));
  cpu::indexer_scores_cpu(c.layer(), c.batch(), q_ref.data(), w_ref.data(), ip, ref.data(), stride);
  return worst_error(c, scores, ref, stride);
}

// Contexts ending inside and at the end of a tile, several tokens of one request, a context of 1.
const std::vector<RequestShape> kShapes = {{1, 1}, {130, 1}, {300, 3}, {256, 1}, {700, 2}};

TEST(IndexerScoreEmu, Bf16KeysMatchCpuAtEveryPageSizeAndRing) {
  for (int64_t ps : {1, 16, 64}) EXPECT_LT(run(kShapes, ps, KvElem::BF16, {}, 1 + uint64_t(ps)), 1e-5) << ps;
  Config two;
  two.two_stages = true;
  EXPECT_LT(run(kShapes, 64, KvElem::BF16, two, 5), 1e-5);
}

TEST(IndexerScoreEmu, Fp8KeysAndQueriesMatchCpu) {
  EXPECT_LT(run(kShapes, 16, KvElem::FP8_E4M3, {}, 7), 1e-5);
  Config two;
  two.two_stages = true;
  EXPECT_LT(run(kShapes, 1, KvElem::FP8_E4M3, two, 8), 1e-5);
}

TEST(IndexerScoreEmu, FixedSplitsMatchCpu) {
  for (int tiles : {1, 2, 3, 16}) {
    Config cfg;
    cfg.tiles_per_cta = tiles;
    EXPECT_LT(run(kShapes, 64, KvElem::BF16, cfg, 10 + uint64_t(tiles)), 1e-5) << tiles;
  }
}

// The grid sized for 64K keys (a decode graph captured at a long context) over rows of <= 700:
// each token's CTAs take its own split; few resident CTAs force several tiles per CTA. Then a row
// a little over half the grid's context where the one-wave share alone (1 tile per CTA) would
// need more CTAs than the grid has: the cover term takes 2.
TEST(IndexerScoreEmu, PerTokenSplitUnderAGridForAFarLongerContextMatchesCpu) {
  for (int resident : {264, 4}) {
    Config cfg;
    cfg.max_ctx = 65536;
    cfg.resident = resident;
    EXPECT_LT(run(kShapes, 64, KvElem::BF16, cfg, 20 + uint64_t(resident)), 1e-5) << resident;
  }
  Config cfg;
  cfg.max_ctx = 65536;  // 512 tiles; 2 tokens x 512 / 930 -> 2 tiles per CTA, 256 CTAs per row
  cfg.resident = 930;
  EXPECT_LT(run({{300, 1}, {40000, 1}}, 64, KvElem::BF16, cfg, 25), 1e-5);  // 313 tiles: 1 per CTA would not cover
}

// The query's interleaved RoPE and the BF16 head weights in the kernel's prologue, against the
// CPU scores of the host-rotated query (each pair rounded to BF16, as a RoPE launch stores it).
TEST(IndexerScoreEmu, FusedQueryRopeAndBf16WeightsMatchCpu) {
  Config cfg;
  cfg.rope = true;
  EXPECT_LT(run(kShapes, 64, KvElem::BF16, cfg, 30), 1e-5);
}

// Two query tokens per CTA sharing the key tiles (prefill chunks). kShapes pairs tokens (0, 1)
// and (4, 5) across request boundaries (one pass per token) and (2, 3), (6, 7) within a request
// (one pass, the earlier token's extra key masked: in the upper half of an m16 tile); `odd`
// pairs (0, 1) within a request with that key in the lower half, and leaves its 11th token alone.
TEST(IndexerScoreEmu, TwoTokensPerCtaMatchCpuWithinAndAcrossRequests) {
  const std::vector<RequestShape> odd = {{40, 2}, {1, 1}, {130, 1}, {300, 3}, {256, 1}, {700, 3}};
  for (bool fp8 : {false, true}) {
    const KvElem e = fp8 ? KvElem::FP8_E4M3 : KvElem::BF16;
    Config cfg;
    cfg.group = 2;
    EXPECT_LT(run(kShapes, 64, e, cfg, 40 + fp8), 1e-5) << fp8;
    EXPECT_LT(run(odd, 16, e, cfg, 42 + fp8), 1e-5) << fp8;
    cfg.tiles_per_cta = 1;
    cfg.two_stages = true;
    EXPECT_LT(run(kShapes, 1, e, cfg, 44 + fp8), 1e-5) << fp8;
    cfg.tiles_per_cta = 0;
    cfg.two_stages = false;
    cfg.max_ctx = 65536;
    cfg.resident = 4;
    EXPECT_LT(run(odd, 64, e, cfg, 46 + fp8), 1e-5) << fp8;
  }
  Config rope;
  rope.group = 2;
  rope.rope = true;
  EXPECT_LT(run(kShapes, 64, KvElem::BF16, rope, 48), 1e-5);
}

}  // namespace
}  // namespace fp4moe::test
