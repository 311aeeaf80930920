#include "tuner/blackwell_layout.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace fp4moe::tuner {
namespace {

constexpr int64_t kSwizzleAlign = 1024;  // 128B-swizzled TMA / UMMA / ldmatrix tiles
constexpr int64_t kBarrier = 8;          // one mbarrier (uint64_t)
constexpr int kSfAtomRows = 128;         // Sm1xxBlockScaledConfig: Blk_MN
constexpr int kSfAtomCols = 4;           //                         Blk_SF
constexpr int kEpiTileN = 32;            // epilogue subtile columns (BF16, TMA store)
constexpr int kEpiStages = 2;
constexpr int kSchedulerStages = 8;      // grouped GEMM tile scheduler pipeline

int sf_vec(WeightFormat w) { return w == WeightFormat::MXFP4 ? 32 : 16; }
const char* sf_type(WeightFormat w) { return w == WeightFormat::MXFP4 ? "UE8M0" : "E4M3"; }

struct Extra {
  const char* name;
  int64_t bytes, align;
  std::string detail;
};

std::vector<Extra> kernel_extras(BsFamily fam, BsTile t) {
  if (fam == BsFamily::Sm120MmaSync) {
    // sm120_blockscaled_mma_builder.inl, grouped (pointer-array) kernel: SchedulerPipelineStorage
    // = PipelineAsyncSharedStorage<8>, TensorMapStorage = 2 descriptors, TensorMapReady = PipelineAsync<3>.
    return {{"tensor maps (grouped A, B)", 2 * 128, 128, "2 x 128 B TMA descriptors"},
            {"tile scheduler pipeline", kSchedulerStages * 2 * kBarrier, 16, "8 stages x 2 mbarriers"},
            {"tensor-map-ready pipeline", 3 * 2 * kBarrier, 16, "3 stages x 2 mbarriers"}};
  }
  // sm100: Sm100DenseGemmTmaUmmaCarveout for a grouped (pointer-array) kernel.
  const int acc_stages = t.n == 256 ? 1 : 2;
  return {{"tensor maps (grouped A, SFA, B, SFB)", 4 * 128, 128, "4 x 128 B TMA descriptors"},
          {"accumulator pipeline (TMEM)", acc_stages * 2 * kBarrier, 16,
           fmt::format("{} stage(s) x 2 mbarriers", acc_stages)},
          {"CLC scheduler pipeline", kSchedulerStages * 2 * kBarrier, 16, "8 stages x 2 mbarriers"},
          {"CLC responses", kSchedulerStages * 16, 16, "8 x 16 B"},
          {"TMEM base pointer + dealloc barrier", 4 + kBarrier, 8, "4 B + 8 B"}};
}

int64_t epi_tile_bytes(BsCtaShape c) { return int64_t(kEpiStages) * c.epi_rows * kEpiTileN * 2; }
int64_t epi_storage_bytes(BsCtaShape c) {  // sizeof(epilogue SharedStorage): 1024-aligned struct
  return align_up(epi_tile_bytes(c) + kEpiStages * 2 * kBarrier, kSwizzleAlign);
}

}  // namespace

BsCtaShape bs_cta_shape(BsFamily fam, BsTile t) {
  BsCtaShape c{};
  c.cta_pair = (fam == BsFamily::Sm100Tcgen05 && t.m == 256) ? 2 : 1;
  c.a_rows = t.m / c.cta_pair;
  c.b_rows = t.n / c.cta_pair;
  c.sfa_rows = c.a_rows;
  // sm_120 keeps at least 128 SFB rows (sSFBTileShape_N = max(N, 128)); on sm_100 each CTA of a
  // pair needs the scale factors of all N columns (copied into its own tensor memory).
  c.sfb_rows = fam == BsFamily::Sm120MmaSync ? std::max(t.n, 128) : t.n;
  c.epi_rows = std::min(c.a_rows, 128);
  return c;
}

int64_t bs_sf_stage_bytes(int rows, int k, WeightFormat w) {
  const int64_t sf_per_row = align_up(k / sf_vec(w), kSfAtomCols);
  return align_up(rows, kSfAtomRows) * sf_per_row;  // 1 byte per scale factor
}

SmemPlan bs_smem_plan(BsFamily fam, BsTile t, int stages, WeightFormat w) {
  const BsCtaShape c = bs_cta_shape(fam, t);
  const int64_t a = int64_t(c.a_rows) * t.k / 2, b = int64_t(c.b_rows) * t.k / 2;
  const int64_t sfa = bs_sf_stage_bytes(c.sfa_rows, t.k, w), sfb = bs_sf_stage_bytes(c.sfb_rows, t.k, w);
  const int sfk = int(align_up(t.k / sf_vec(w), kSfAtomCols));
  SmemPlan p;
  p.add("A: activations (FP4)", stages * a, kSwizzleAlign,
        fmt::format("{} x {} rows x {} B ({} FP4)", stages, c.a_rows, t.k / 2, t.k));
  p.add("B: weights (FP4)", stages * b, kSwizzleAlign,
        fmt::format("{} x {} rows x {} B ({} FP4)", stages, c.b_rows, t.k / 2, t.k));
  p.add("SFA: activation scale factors", stages * sfa, 16,
        fmt::format("{} x {} rows x {} {} (1 per {}, 128x4 atoms)", stages, align_up(c.sfa_rows, kSfAtomRows),
                    sfk, sf_type(w), sf_vec(w)));
  p.add("SFB: weight scale factors", stages * sfb, 16,
        fmt::format("{} x {} rows x {} {} (1 per {}, 128x4 atoms)", stages, align_up(c.sfb_rows, kSfAtomRows),
                    sfk, sf_type(w), sf_vec(w)));
  p.end_struct("mainloop tensors", kSwizzleAlign);
  p.add("mainloop mbarriers", stages * 2 * kBarrier, 16, fmt::format("{} x (full + empty) x 8 B", stages));
  p.end_struct("mainloop storage", kSwizzleAlign);
  p.add("epilogue D tile (BF16, TMA store)", epi_tile_bytes(c), kSwizzleAlign,
        fmt::format("{} x {} rows x {} cols x 2 B", kEpiStages, c.epi_rows, kEpiTileN));
  p.add("epilogue mbarriers", kEpiStages * 2 * kBarrier, 16, "2 x 2 x 8 B");
  p.end_struct("epilogue storage", kSwizzleAlign);
  for (const Extra& e : kernel_extras(fam, t)) p.add(e.name, e.bytes, e.align, e.detail);
  p.end_struct("kernel shared storage", kSwizzleAlign);
  return p;
}

int64_t bs_naive_stage_bytes(BsTile t, WeightFormat w, BsFamily fam) {
  const BsCtaShape c = bs_cta_shape(fam, t);
  return int64_t(c.a_rows) * t.k / 2 + int64_t(c.b_rows) * t.k / 2 + bs_sf_stage_bytes(c.sfa_rows, t.k, w) +
         bs_sf_stage_bytes(c.sfb_rows, t.k, w) + 2 * kBarrier;
}

int64_t bs_naive_carveout(BsFamily fam, BsTile t) {
  int64_t s = epi_storage_bytes(bs_cta_shape(fam, t));
  for (const Extra& e : kernel_extras(fam, t)) s += e.bytes;
  return s;
}

int bs_naive_stage_count(BsFamily fam, BsTile t, WeightFormat w, int64_t capacity) {
  const int64_t left = capacity - bs_naive_carveout(fam, t);
  return left <= 0 ? 0 : int(left / bs_naive_stage_bytes(t, w, fam));
}

int bs_aligned_stage_count(BsFamily fam, BsTile t, WeightFormat w, int64_t capacity) {
  int s = 0;
  while (s < 64 && bs_smem_plan(fam, t, s + 1, w).total() <= capacity) ++s;
  return s;
}

}  // namespace fp4moe::tuner
