// Our MLA decode kernels (cuda/attention/mla_decode_mma.cuh) run on the CPU through the CUDA
// emulator (tests/cuda/emu), against cpu::mla_attention_cpu: dense decode (contexts 1, tile
// and page boundaries +-1, keys split over several items and merged) and sparse rows over slot
// lists (long items stream many tiles), BF16 cache (worst row error < 5e-3) and FP8 E4M3 (< 4e-3), 64 and 128 heads, LSE;
// the mma.sync, wgmma and warp-specialized FP8 (mla_decode_ws.cuh) kernels;
// outputs poisoned. The emulator follows the PTX fragment definitions, so this checks the
// kernels' fragment layouts, the FP8 dim / column permutations, masking and the merge.
// Needs no GPU (runs in CI); mla_attention_test runs the kernels on the device.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/attention/mla_decode_ws.cuh"

#include <gtest/gtest.h>

#include <set>

#include "cpu/attention/mla_cpu.hpp"
#include "cuda/attention_case.hpp"

namespace fp4moe::test {
namespace {

namespace dc = cuda::attention::decode;
constexpr float kSmScale = 0.0625f;

struct Run {
  std::vector<float> out, lse;
};

// Dense when `topk` is empty (every request has one new token); else sparse rows over the
// positions topk [T, k] (-1 padded), given to the kernel as cache slots.
// dev_splits > 0: MlaDecodeMma::run_device's schedule, computed in the kernels from the rows'
// lengths (Params::sched), with that many item slots per row, instead of build_schedule's arrays.
bool g_wgmma = false;  // emu_decode runs the wgmma variant
bool g_ws = false;     // emu_decode runs the warp-specialized FP8 variant (mla_decode_ws.cuh)
bool g_ws_q_regs = false;  // ... with Q in registers

Run emu_decode(PagedCase& c, int heads, const Bf16Data& qn, const Bf16Data& qp, const std::vector<int32_t>& topk, int k,
               int slots, int dev_splits = 0) {
  const bool fp8 = c.elem == KvElem::FP8_E4M3;
  const int64_t T = c.tokens();
  const KvBatchView b = c.batch();
  std::vector<int32_t> kv_len, table, indices;
  int page_shift = 0;
  if (topk.empty()) {
    page_shift = __builtin_ctzll(uint64_t(c.page_size));
    indices = c.page_indices;
    for (int64_t r = 0; r < b.num_requests; ++r) kv_len.push_back(b.kv_len[r]), table.push_back(b.page_indptr[r]);
  } else {
    std::vector<int32_t> req(static_cast<size_t>(T));
    kv_token_requests(b, req.data());
    indices.assign(size_t(T) * k, -1);
    for (int64_t t = 0; t < T; ++t) {
      int n = 0;
      for (int i = 0; i < k; ++i) {
        const int32_t pos = topk[size_t(t * k + i)];
        if (pos >= 0) indices[size_t(t * k + n++)] = int32_t(kv_slot(b, c.page_size, req[size_t(t)], pos));
      }
      kv_len.push_back(n);
      table.push_back(int32_t(t * k));
    }
  }
  dc::Schedule s;
  int items = 0, merges = 0;
  dc::DeviceSchedule ds{};
  if (dev_splits == 0) {
    s = dc::build_schedule(kv_len, table, slots, dc::tile_keys(fp8, g_wgmma, g_ws));
    items = int(s.items.size()), merges = int(s.merges.size());
  } else {
    const int rows = int(T);
    items = rows * dev_splits, merges = dev_splits > 1 ? rows : 0;
    s.partials = rows * dev_splits;
    ds.kv_len = kv_len.data();
    ds.page_indptr = table.data();
    ds.positions = c.positions.data();
    ds.top_k = topk.empty() ? 0 : k;
    ds.tokens = rows;
    ds.splits = dev_splits;
    ds.tile_keys = dc::tile_keys(fp8, g_wgmma, g_ws);
  }
  std::vector<uint16_t> out(size_t(T) * heads * kCkvDim, 0xffff);  // NaN
  std::vector<float> lse(size_t(T) * heads, NAN), part_o(size_t(s.partials) * heads * kCkvDim + 4, NAN),
      part_lse(size_t(s.partials) * heads + 1, NAN);
  dc::Params p{};
  p.q_nope = qn.bits.data();
  p.q_pe = qp.bits.data();
  p.ckv = c.ckv.data();
  p.kpe = c.kpe.data();
  p.kv_indices = indices.data();
  p.items = dev_splits == 0 ? s.items.data() : nullptr;
  p.merges = dev_splits == 0 ? s.merges.data() : nullptr;
  p.sched = ds;
  p.page_shift = page_shift;
  p.num_heads = heads;
  p.sm_scale = kSmScale;
  p.ckv_scale = fp8 ? c.ckv_scale : 1.f;
  p.kpe_scale = fp8 ? c.kpe_scale : 1.f;
  p.out = out.data();
  p.lse = lse.data();
  p.part_o = part_o.data();
  p.part_lse = part_lse.data();
  const dim3 grid(unsigned(items), unsigned(heads / dc::kHeadsPerCta));
  if (g_ws)
    emu::launch(grid, dim3(dc::CfgWs::kThreads), dc::smem_bytes(true, true, true),
                g_ws_q_regs ? dc::mla_decode_ws_kernel<true> : dc::mla_decode_ws_kernel<false>, p);
  else if (fp8 && g_wgmma) emu::launch(grid, dim3(dc::kThreads), dc::smem_bytes(true, true), dc::mla_decode_kernel<true, true>, p);
  else if (fp8) emu::launch(grid, dim3(dc::kThreads), dc::smem_bytes(true), dc::mla_decode_kernel<true>, p);
  else if (g_wgmma) emu::launch(grid, dim3(dc::kThreads), dc::smem_bytes(false, true), dc::mla_decode_kernel<false, true>, p);
  else emu::launch(grid, dim3(dc::kThreads), dc::smem_bytes(false), dc::mla_decode_kernel<false>, p);
  if (merges > 0) emu::launch(dim3(unsigned(merges), unsigned(heads)), dim3(dc::kMergeThreads), 0, dc::mla_merge_kernel, p);
  return {bf16_to_floats(out), lse};
}

Run cpu_decode(PagedCase& c, int heads, const Bf16Data& qn, const Bf16Data& qp, const std::vector<int32_t>& topk, int k) {
  Run r;
  r.out.resize(size_t(c.tokens()) * heads * kCkvDim);
  r.lse.resize(size_t(c.tokens()) * heads);
  cpu::MlaAttentionParams mp;
  mp.num_heads = heads;
  mp.sm_scale = kSmScale;
  mp.topk = topk.empty() ? nullptr : topk.data();
  mp.topk_k = k;
  cpu::mla_attention_cpu(c.layer(), c.batch(), qn.f.data(), qp.f.data(), mp, r.out.data(), r.lse.data());
  return r;
}

// Random distinct causal positions per token, sorted, -1 padded (what the indexer emits).
std::vector<int32_t> random_topk(const PagedCase& c, int k, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> out(size_t(c.tokens()) * k, -1);
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const int n = c.positions[size_t(t)] + 1;
    std::vector<int32_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), g);
    all.resize(size_t(std::min(n, k)));
    std::sort(all.begin(), all.end());
    std::copy(all.begin(), all.end(), out.begin() + t * k);
  }
  return out;
}

void check(const std::vector<RequestShape>& shapes, int64_t page_size, KvElem elem, int heads, int k, int slots,
           uint64_t seed, int dev_splits = 0) {
  PagedCase c = make_paged_case(shapes, page_size, elem, KvElem::BF16, seed);
  const Bf16Data qn = random_bf16(size_t(c.tokens()) * heads * kCkvDim, seed + 1, 0.5f),
                 qp = random_bf16(size_t(c.tokens()) * heads * kKpeDim, seed + 2, 0.5f);
  const std::vector<int32_t> topk = k > 0 ? random_topk(c, k, seed + 3) : std::vector<int32_t>{};
  const Run g = emu_decode(c, heads, qn, qp, topk, k, slots, dev_splits), r = cpu_decode(c, heads, qn, qp, topk, k);
  // Bounds: a few times the rounding the kernels add to the same inputs (the CPU reference reads
  // the same BF16 q and the same BF16 / FP8 cache, and accumulates in FP32). Two roundings remain:
  // the BF16 output (7 stored significand bits: RMS relative error 2^-7 / sqrt(12) / ~1.44 =
  // 1.6e-3) and, on the BF16 path, the softmax weights P rounded to BF16 before the P.V MMA
  // (another ~1.6e-3 on a weighted mean of random values), together ~2.2e-3; the FP8 path
  // turns P into FP16 (2^-10: ~2e-4), ~1.6e-3. Measured worst rows over every case below:
  // BF16 2.61e-3, FP8 1.86e-3 (x86-64, g++ 12). The LSE is FP32 arithmetic on |lse| < 30:
  // measured worst 1.9e-5 (a few FP32 ulps of the sum of ~1000 exponentials), bound 1e-4.
  // A one-key masking slip at 1000 keys moves a row by ~3e-2, a fragment-layout error by O(1).
  const double tol = elem == KvElem::BF16 ? 5e-3 : 4e-3;
  EXPECT_LT(worst_row_rel_error(g.out, r.out, kCkvDim), tol) << kv_elem_name(elem) << " heads " << heads << " k " << k;
  EXPECT_LT(worst_lse_error(g.lse, r.lse), 1e-4) << "lse " << kv_elem_name(elem);
}

TEST(MlaDecodeEmu, DenseBf16) {
  // contexts 1, 31 / 32 / 33 (tile), 65 (page), 200 split over several items (4 slots)
  check({{1, 1}, {31, 1}, {33, 1}, {65, 1}, {200, 1}}, 16, KvElem::BF16, 64, 0, 4, 1);
}

TEST(MlaDecodeEmu, DenseFp8) {
  check({{1, 1}, {63, 1}, {129, 1}, {300, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 4, 2);
}

TEST(MlaDecodeEmu, SparseRowsBf16And128Heads) {
  check({{50, 1}, {300, 2}}, 1, KvElem::BF16, 64, 96, 3, 3);
  check({{70, 1}, {2, 1}}, 16, KvElem::BF16, 128, 0, 2, 4);
}

TEST(MlaDecodeEmu, SparseRowsFp8) {
  check({{40, 1}, {400, 2}}, 64, KvElem::FP8_E4M3, 64, 160, 3, 5);
}

// One item per row (1 slot): many tiles stream through the 3-stage ring, and the slots of tile
// t + 3 are read from the page table / slot list while tile t is computed.
TEST(MlaDecodeEmu, LongItemsStreamTheirSlotsThroughTheRing) {
  check({{700, 1}, {97, 1}}, 16, KvElem::BF16, 64, 0, 1, 12);
  check({{900, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 1, 13);
  check({{1000, 1}}, 1, KvElem::BF16, 64, 600, 1, 14);
  check({{1000, 1}}, 1, KvElem::FP8_E4M3, 64, 700, 1, 15);
}

// The wgmma variant (BF16 cache): the same cases as the mma.sync path's (dense over tile and page
// boundaries and split rows, sparse rows, 128 heads, long items through the ring, the device
// schedule), so its shared-memory layout, descriptors and fragments are checked against the CPU.
TEST(MlaDecodeEmu, WgmmaVariantMatchesCpu) {
  g_wgmma = true;
  check({{1, 1}, {31, 1}, {33, 1}, {65, 1}, {200, 1}}, 16, KvElem::BF16, 64, 0, 4, 21);
  check({{50, 1}, {300, 2}}, 1, KvElem::BF16, 64, 96, 3, 22);
  check({{70, 1}, {2, 1}}, 16, KvElem::BF16, 128, 0, 2, 23);
  check({{700, 1}, {97, 1}}, 16, KvElem::BF16, 64, 0, 1, 24);
  check({{1, 1}, {129, 1}, {300, 1}}, 64, KvElem::BF16, 64, 0, 0, 25, 3);
  g_wgmma = false;
}

// The wgmma variant with an FP8 cache (codes converted to FP16 tiles in shared memory): the same
// cases, the FP8 bound (4e-3).
TEST(MlaDecodeEmu, WgmmaVariantWithAnFp8CacheMatchesCpu) {
  g_wgmma = true;
  check({{1, 1}, {63, 1}, {129, 1}, {300, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 4, 26);
  check({{40, 1}, {400, 2}}, 64, KvElem::FP8_E4M3, 64, 160, 3, 27);
  check({{70, 1}, {2, 1}}, 16, KvElem::FP8_E4M3, 128, 0, 2, 28);
  check({{900, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 1, 29);
  check({{1, 1}, {129, 1}, {300, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 0, 30, 3);
  g_wgmma = false;
}

// The warp-specialized FP8 variant (a producer warpgroup converting each tile once into a 2-tile
// FP16 ring, two consumer warpgroups; named-barrier handshakes): contexts of 1 key, of a
// non-multiple of the 32-key tile, rows split over several items (host schedule and device
// schedule), sparse rows, 128 heads, and long items whose tiles cycle both rings many times
// (the emulator fails mixed counts on one named-barrier generation, a deadlock, and an arrival
// left over at the block's end). The FP8 bound (4e-3): the same FP16 math as the wgmma variant's.
void check_warp_specialized_cases() {
  check({{1, 1}, {63, 1}, {129, 1}, {300, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 4, 41);
  check({{40, 1}, {400, 2}}, 64, KvElem::FP8_E4M3, 64, 160, 3, 42);
  check({{70, 1}, {2, 1}}, 16, KvElem::FP8_E4M3, 128, 0, 2, 43);
  check({{900, 1}, {33, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 1, 44);
  check({{1000, 1}}, 1, KvElem::FP8_E4M3, 64, 700, 1, 45);
  check({{1, 1}, {129, 1}, {300, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 0, 46, 3);
  check({{40, 1}, {400, 2}}, 64, KvElem::FP8_E4M3, 64, 160, 0, 47, 2);
}
TEST(MlaDecodeEmu, WarpSpecializedFp8VariantMatchesCpu) {
  g_ws = true;
  check_warp_specialized_cases();
  g_ws = false;
}
// The same with Q's fragments in registers for 14 of the 18 QK steps (m64n32k16 with A from
// registers): the register fragments, the steps from shared memory after them.
TEST(MlaDecodeEmu, WarpSpecializedFp8VariantWithQInRegistersMatchesCpu) {
  g_ws = g_ws_q_regs = true;
  check_warp_specialized_cases();
  g_ws = g_ws_q_regs = false;
}

// Its handshakes in the emulator: arrivals of one generation with different thread counts, a
// barrier that never completes, or an arrival left over at the block's end fail the run instead
// of passing silently.
TEST(MlaDecodeEmu, NamedBarrierMisuseFails) {
  EXPECT_DEATH(emu::launch(dim3(1), dim3(64), 0,
                           [] {
                             if (threadIdx.x < 32) cuda::prims::bar_arrive(1, 64);
                             else cuda::prims::bar_sync(1, 96);
                           }),
               "different counts");
  EXPECT_DEATH(emu::launch(dim3(1), dim3(64), 0, [] { if (threadIdx.x < 32) cuda::prims::bar_sync(2, 64); }),
               "deadlock");
  EXPECT_DEATH(emu::launch(dim3(1), dim3(64), 0, [] { if (threadIdx.x < 32) cuda::prims::bar_arrive(3, 64); }),
               "unfinished generation");
}

// The descriptor's fields where the PTX ISA puts them: start, LBO and SBO in 16-byte units at
// bits 0, 16 and 32 (14 bits each), base offset and swizzle mode (bits 49, 62) zero: no swizzle.
TEST(MlaDecodeEmu, WgmmaDescriptorFieldsAreWhereThePtxIsaPutsThem) {
  uint64_t d = 0;
  emu::launch(dim3(1), dim3(1), 0x4000, [&] { d = cuda::prims::smem_desc(emu::dynamic_smem() + 0x2A30, 9216, 128); });
  EXPECT_EQ(d & 0x3FFF, uint64_t(0x2A30 >> 4));
  EXPECT_EQ((d >> 16) & 0x3FFF, uint64_t(9216 >> 4));
  EXPECT_EQ((d >> 32) & 0x3FFF, uint64_t(128 >> 4));
  EXPECT_EQ(d >> 46, 0u);
}

// The device-built schedule (graph-capturable run_device): a grid sized for longer rows than the
// batch has (unused items empty, unsplit rows' merges skipped), rows of 1 key up to several
// parts, and one slot per row (no merges at all).
TEST(MlaDecodeEmu, DeviceScheduleDenseAnyLengthsWithinTheGrid) {
  check({{1, 1}, {31, 1}, {33, 1}, {65, 1}, {200, 1}}, 16, KvElem::BF16, 64, 0, 0, 6, 8);
  check({{1, 1}, {129, 1}, {300, 1}}, 64, KvElem::FP8_E4M3, 64, 0, 0, 7, 3);
  check({{70, 1}, {2, 1}}, 16, KvElem::BF16, 128, 0, 0, 8, 1);
}

TEST(MlaDecodeEmu, DeviceScheduleSparseRows) {
  check({{50, 1}, {300, 2}}, 1, KvElem::BF16, 64, 96, 0, 9, 4);
  check({{40, 1}, {400, 2}}, 64, KvElem::FP8_E4M3, 64, 160, 0, 10, 2);
}

TEST(MlaDecodeEmu, ScheduleSplitsLongRowsOnly) {
  const dc::Schedule s = dc::build_schedule({100000, 1, 64}, {0, 10, 20}, 132, 32);
  int parts_long = 0, covered = 0;
  for (const dc::Item& it : s.items) {
    if (it.token == 0) {
      ++parts_long, covered += it.kv_end - it.kv_start;
    } else {
      EXPECT_EQ(it.partial, -1);
    }
    EXPECT_EQ(it.table_offset, it.token * 10);
  }
  EXPECT_EQ(covered, 100000);
  EXPECT_GT(parts_long, 100);
  ASSERT_EQ(s.merges.size(), 1u);
  EXPECT_EQ(s.merges[0].count, parts_long);
  for (size_t i = 1; i < s.items.size(); ++i)
    EXPECT_GE(s.items[i - 1].kv_end - s.items[i - 1].kv_start, s.items[i].kv_end - s.items[i].kv_start);
}

// The one split rule (host schedule and the kernels' in-place one): every tile in exactly one
// part, at most `want` parts, parts of >= 2 tiles when there are several, all but the last equal.
TEST(MlaDecodeEmu, SplitPartsCoverEveryTileInPartsOfAtLeastTwoTiles) {
  for (int tiles = 0; tiles <= 300; ++tiles) {
    for (int want : {-1, 0, 1, 2, 3, 7, 16, 132, 1000}) {
      const dc::PartSplit p = dc::split_parts(tiles, want);
      ASSERT_GE(p.n, 1) << tiles << " " << want;
      ASSERT_GE(p.per_tiles, 1) << tiles << " " << want;
      EXPECT_LE(p.n, std::max(1, want)) << tiles << " " << want;
      EXPECT_GE(int64_t(p.n) * p.per_tiles, tiles) << tiles << " " << want;        // covered
      EXPECT_LT(int64_t(p.n - 1) * p.per_tiles, std::max(tiles, 1)) << tiles << " " << want;  // last part not empty
      if (p.n > 1) {
        EXPECT_GE(p.per_tiles, 2) << tiles << " " << want;
      }
    }
  }
  const dc::Schedule s = dc::build_schedule({0, 5}, {0, 10}, 132, 32);  // a zero-length row: one empty item
  ASSERT_EQ(s.items.size(), 2u);
  EXPECT_TRUE(s.merges.empty());
}

// The merge kernel alone, against a double-precision merge: rows split in 1 part (a lone
// partial), below, at and across its load batch (kMergeBatch 8) and its 128-part weight chunk,
// with LSEs spread over +-40 (weights down to 2^-80), parts of other rows interleaved between
// (merge slot `first` offsets), a row that must be skipped (count 0), and outputs poisoned.
TEST(MlaDecodeEmu, MergeOfAnyPartCountMatchesADoubleMerge) {
  const int heads = 64;
  const std::vector<int> counts = {1, 7, 8, 9, 17, 128, 130, 300, 0};
  std::vector<dc::Merge> merges;
  int partials = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    merges.push_back({int32_t(r), partials + 3, counts[r], 0});
    partials += counts[r] + 3;  // 3 unused rows before each row's parts
  }
  std::mt19937_64 g(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f), spread(-40.f, 40.f);
  std::vector<float> part_o(size_t(partials) * heads * kCkvDim), part_lse(size_t(partials) * heads);
  for (float& x : part_o) x = u(g);
  for (float& x : part_lse) x = spread(g);
  std::vector<uint16_t> out(counts.size() * heads * kCkvDim, 0xffff);
  std::vector<float> lse(counts.size() * heads, NAN);
  dc::Params p{};
  p.num_heads = heads;
  p.out = out.data();
  p.lse = lse.data();
  p.part_o = part_o.data();
  p.part_lse = part_lse.data();
  p.merges = merges.data();
  emu::launch(dim3(unsigned(merges.size()), unsigned(heads)), dim3(dc::kMergeThreads), 0, dc::mla_merge_kernel, p);
  const std::vector<float> got = bf16_to_floats(out);
  for (size_t r = 0; r < counts.size(); ++r)
    for (int h = 0; h < heads; ++h) {
      const size_t row = r * heads + size_t(h);
      if (counts[r] == 0) {
        EXPECT_TRUE(std::isnan(lse[row])) << "row " << r << " has no parts: left alone";
        EXPECT_EQ(out[row * kCkvDim], 0xffff);
        continue;
      }
      double mx = -INFINITY;
      for (int i = 0; i < counts[r]; ++i) mx = std::max<double>(mx, part_lse[size_t(merges[r].first + i) * heads + h]);
      double wsum = 0;
      std::vector<double> want(kCkvDim, 0.0);
      for (int i = 0; i < counts[r]; ++i) {
        const size_t pr = size_t(merges[r].first + i) * heads + size_t(h);
        const double w = std::exp2(double(part_lse[pr]) - mx);
        wsum += w;
        for (int d = 0; d < kCkvDim; ++d) want[size_t(d)] += w * part_o[pr * kCkvDim + size_t(d)];
      }
      // The merged value is a convex combination of parts in [-1, 1], so |want| < 1 and its BF16
      // rounding is at most half an ulp, 2^-9, plus the FP32 merge arithmetic (~1e-6): measured
      // worst 1.953e-3 = 2^-9. The LSE: FP32 on |lse| < 30, measured worst 2.3e-6 (~1 ulp), bound ~10 ulps.
      for (int d = 0; d < kCkvDim; ++d)
        ASSERT_NEAR(got[row * kCkvDim + size_t(d)], want[size_t(d)] / wsum, 0x1p-9 + 1e-5)
            << "row " << r << " (" << counts[r] << " parts) head " << h << " dim " << d;
      EXPECT_NEAR(lse[row], (mx + std::log2(wsum)) * std::log(2.0), 2e-5) << "row " << r << " head " << h;
    }
}

}  // namespace
}  // namespace fp4moe::test
