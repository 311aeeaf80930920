// MlaSm90 (FlashInfer's SM90 MLA kernel behind our planner) and MlaDecodeMma (our decode
// kernel) against cpu::mla_attention_cpu: dense decode, chunked causal prefill (MlaSm90) and
// sparse rows over top-k slots; BF16 KV (worst row error < 1e-2) and FP8 KV (< 3e-2);
// contexts 1, page-size multiples +-1, 100K beside 1, page sizes 1 / 16 / 64 with pages out of
// order, 64 and 128 heads (ours); sparse with top-k >= context equals dense; poisoned outputs;
// bad input (page out of range, unsupported heads, misplaced tokens, prefill chunks for ours).
// MlaSm90::run_device (the schedule built on the device) eagerly and replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <utility>

#include "cpu/attention/indexer_cpu.hpp"
#include "cpu/attention/mla_cpu.hpp"
#include "cuda/attention/mla.hpp"
#include "cuda/attention/mla_decode.hpp"
#include "cuda/attention_test_util.hpp"

namespace fp4moe::test {
namespace {

namespace at = cuda::attention;
constexpr int kHeads = 64;
constexpr float kSmScale = 0.0625f;  // (192 + 64)^-1/2


struct Queries {
  Bf16Data nope, pe;  // [T, heads, 512], [T, heads, 64]
  int heads = kHeads;
};
Queries random_queries(int64_t T, uint64_t seed, int heads = kHeads) {
  return {random_bf16(size_t(T) * heads * kCkvDim, seed, 0.5f), random_bf16(size_t(T) * heads * kKpeDim, seed + 1, 0.5f),
          heads};
}

struct Result {
  std::vector<float> out, lse;
};

Result cpu_mla(PagedCase& c, const Queries& q, const int32_t* topk, int64_t k) {
  Result r;
  r.out.resize(size_t(c.tokens()) * q.heads * kCkvDim);
  r.lse.resize(size_t(c.tokens()) * q.heads);
  cpu::MlaAttentionParams p;
  p.num_heads = q.heads;
  p.sm_scale = kSmScale;
  p.topk = topk;
  p.topk_k = k;
  cpu::mla_attention_cpu(c.layer(), c.batch(), q.nope.f.data(), q.pe.f.data(), p, r.out.data(), r.lse.data());
  return r;
}

// FlashInferDevice: MlaSm90::run_device (the schedule built on the device); FlashInferGraph: the
// same captured in a CUDA graph and replayed.
// MmaDevice / MmaGraph: the same for MlaDecodeMma::run_device. Wgmma / WgmmaGraph: MlaDecodeMma's
// wgmma variant (BF16 cache, sm_90), host-planned / run_device in a graph. WgmmaWs / WgmmaWsGraph: its
// warp-specialized wgmma variant (FP8 cache, sm_90), the same two ways.
enum class Impl {
  FlashInfer, Mma, FlashInferDevice, FlashInferGraph, MmaDevice, MmaGraph, Wgmma, WgmmaGraph, WgmmaWs, WgmmaWsGraph,
  WgmmaWsQRegs, WgmmaWsQRegsGraph  // ... with Q in registers
};
int g_forced_splits = 0;  // FlashInferDevice / Graph: MlaDeviceRows::splits
bool g_pdl = false;       // the device-scheduled runs: MlaDeviceRows::pdl

// Dense when slots is null; else sparse over slots [T, k] (device page table of page_size 1).
// Outputs poisoned (NaN) before the run.
Result gpu_mla(PagedCase& c, const Queries& q, const std::vector<int32_t>* slots, int k, Impl impl = Impl::FlashInfer) {
  const int64_t T = c.tokens();
  DeviceCache dc(c);
  DeviceArray<uint16_t> qn(q.nope.bits), qp(q.pe.bits);
  DeviceArray<uint16_t> out(size_t(T) * q.heads * kCkvDim);  // poisoned (NaN)
  DeviceArray<float> lse(size_t(T) * q.heads);
  DeviceArray<int32_t> pages(c.page_indices);
  DeviceArray<int32_t> d_slots(slots ? *slots : std::vector<int32_t>(1, 0));
  at::MlaRunArgs a;
  a.q_nope = qn.ptr;
  a.q_pe = qp.ptr;
  a.layer = dc.L;
  a.out = out.ptr;
  a.lse = lse.ptr;
  a.kv_indices = slots ? d_slots.ptr : pages.ptr;
  auto go = [&](auto& mla) {
    if (slots) mla.plan_sparse(c.batch(), k, nullptr);
    else mla.plan(c.batch(), c.page_size, c.num_pages, nullptr);
    mla.run(a, nullptr);
  };
  if (impl == Impl::Mma || impl == Impl::Wgmma || impl == Impl::WgmmaWs || impl == Impl::WgmmaWsQRegs) {
    at::MlaDecodeMma mla({q.heads, kSmScale, c.elem}, impl == Impl::Wgmma          ? at::DecodeMath::kWgmma
                                                      : impl == Impl::WgmmaWs      ? at::DecodeMath::kWgmmaWs
                                                      : impl == Impl::WgmmaWsQRegs ? at::DecodeMath::kWgmmaWsQRegs
                                                                                   : at::DecodeMath::kMmaSync);
    go(mla);
  } else if (impl == Impl::FlashInferDevice || impl == Impl::FlashInferGraph || impl == Impl::MmaDevice ||
             impl == Impl::MmaGraph || impl == Impl::WgmmaGraph || impl == Impl::WgmmaWsGraph ||
             impl == Impl::WgmmaWsQRegsGraph) {
    const KvBatchView b = c.batch();
    DeviceArray<int32_t> len(std::vector<int32_t>(b.kv_len, b.kv_len + b.num_requests));
    DeviceArray<int32_t> indptr(std::vector<int32_t>(b.page_indptr, b.page_indptr + b.num_requests + 1));
    DeviceArray<int32_t> pos(std::vector<int32_t>(b.positions, b.positions + b.num_tokens));
    at::MlaDeviceRows rows;
    rows.tokens = int(T);
    if (slots) {
      rows.positions = pos.ptr;
      rows.top_k = k;
      rows.max_keys = int(std::min<int64_t>(c.max_ctx(), k));
    } else {
      rows.kv_len = len.ptr;
      rows.page_indptr = indptr.ptr;
      rows.page_size = c.page_size;
      rows.max_keys = int(c.max_ctx());
    }
    rows.splits = g_forced_splits;
    rows.pdl = g_pdl;
    auto device_run = [&](auto& mla, bool graph) {
      mla.reserve_device(int(T));
      if (!graph) {
        mla.run_device(a, rows, nullptr);
        return;
      }
      cudaStream_t s = nullptr;
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
      EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
      mla.run_device(a, rows, s);
      EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
      EXPECT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
      EXPECT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(s);
    };
    if (impl == Impl::WgmmaGraph || impl == Impl::WgmmaWsGraph || impl == Impl::WgmmaWsQRegsGraph) {
      at::MlaDecodeMma mla({q.heads, kSmScale, c.elem}, impl == Impl::WgmmaGraph     ? at::DecodeMath::kWgmma
                                                        : impl == Impl::WgmmaWsGraph ? at::DecodeMath::kWgmmaWs
                                                                                     : at::DecodeMath::kWgmmaWsQRegs);
      device_run(mla, true);
    } else if (impl == Impl::MmaDevice || impl == Impl::MmaGraph) {
      at::MlaDecodeMma mla({q.heads, kSmScale, c.elem});
      device_run(mla, impl == Impl::MmaGraph);
    } else {
      at::MlaSm90 mla({q.heads, kSmScale, c.elem});
      device_run(mla, impl == Impl::FlashInferGraph);
    }
  } else {
    at::MlaSm90 mla({q.heads, kSmScale, c.elem});
    go(mla);
  }
  return {bf16_to_floats(out.download()), lse.download()};
}

double tolerance(KvElem e) { return e == KvElem::BF16 ? 1e-2 : 3e-2; }

void check_dense(const std::vector<RequestShape>& shapes, int64_t page_size, KvElem elem, uint64_t seed,
                 Impl impl = Impl::FlashInfer, int heads = kHeads) {
  PagedCase c = make_paged_case(shapes, page_size, elem, KvElem::BF16, seed);
  const Queries q = random_queries(c.tokens(), seed + 5, heads);
  const Result g = gpu_mla(c, q, nullptr, 0, impl), r = cpu_mla(c, q, nullptr, 0);
  EXPECT_LT(worst_row_rel_error(g.out, r.out, kCkvDim), tolerance(elem))
      << "page_size " << page_size << " " << kv_elem_name(elem) << " heads " << heads;
  EXPECT_LT(worst_lse_error(g.lse, r.lse), 2e-2) << "lse, page_size " << page_size;
}

const std::vector<RequestShape> kDecodeShapes = {{1, 1}, {63, 1}, {64, 1}, {65, 1}, {1000, 1}, {4097, 1}};

TEST(MlaAttentionTiny, DecodeMatchesCpuBf16) {
  FP4MOE_SKIP_WITHOUT_SM90();
  check_dense({{1, 1}, {65, 1}, {200, 1}}, 64, KvElem::BF16, 1);
}

TEST(MlaAttentionTiny, DecodeMatchesCpuFp8) {
  FP4MOE_SKIP_WITHOUT_SM90();
  check_dense({{1, 1}, {65, 1}, {200, 1}}, 64, KvElem::FP8_E4M3, 2);
}

TEST(MlaAttention, DecodeMatchesCpuEveryPageSize) {
  FP4MOE_SKIP_WITHOUT_SM90();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    for (int64_t ps : {1, 16, 64}) check_dense(kDecodeShapes, ps, e, 10 + uint64_t(ps));
}

TEST(MlaAttention, DecodeLengths1And100KInOneBatch) {
  FP4MOE_SKIP_WITHOUT_SM90();
  check_dense({{1, 1}, {100000, 1}, {3, 1}}, 64, KvElem::BF16, 20);
}

TEST(MlaAttention, ChunkedPrefillMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    check_dense({{300, 37}, {128, 128}, {1, 1}, {1000, 64}, {70, 3}}, 64, e, 30);
    check_dense({{129, 129}, {517, 100}}, 16, e, 31);
  }
}

// Top-k positions of random scores (CPU top-k) and their slots.
struct Selection {
  std::vector<int32_t> pos, slots;
};
Selection random_selection(const PagedCase& c, int k, uint64_t seed) {
  const int64_t stride = c.max_ctx();
  const auto scores = random_floats(size_t(c.tokens() * stride), seed);
  Selection s;
  s.pos.resize(size_t(c.tokens() * k));
  cpu::indexer_topk_cpu(c.batch(), scores.data(), stride, k, s.pos.data());
  std::vector<int32_t> req(size_t(c.tokens()));
  kv_token_requests(c.batch(), req.data());
  s.slots.resize(s.pos.size());
  for (size_t i = 0; i < s.pos.size(); ++i) {
    const int32_t p = s.pos[i];
    s.slots[i] = p < 0 ? -1 : int32_t(kv_slot(c.batch(), c.page_size, req[i / size_t(k)], p));
  }
  return s;
}

void check_sparse(const std::vector<RequestShape>& shapes, int64_t page_size, KvElem elem, int k, uint64_t seed,
                  Impl impl = Impl::FlashInfer) {
  PagedCase c = make_paged_case(shapes, page_size, elem, KvElem::BF16, seed);
  const Queries q = random_queries(c.tokens(), seed + 5);
  const Selection sel = random_selection(c, k, seed + 9);
  const Result g = gpu_mla(c, q, &sel.slots, k, impl), r = cpu_mla(c, q, sel.pos.data(), k);
  EXPECT_LT(worst_row_rel_error(g.out, r.out, kCkvDim), tolerance(elem)) << "k " << k << " " << kv_elem_name(elem);
  EXPECT_LT(worst_lse_error(g.lse, r.lse), 2e-2) << "lse, k " << k;
}

TEST(MlaAttentionTiny, SparseDecodeMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  check_sparse({{1, 1}, {40, 1}, {300, 2}}, 16, KvElem::BF16, 64, 40);
}

TEST(MlaAttention, SparseTopK2048MatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 41);
}

TEST(MlaAttention, SparseWithTopKAtLeastContextEqualsDense) {
  FP4MOE_SKIP_WITHOUT_SM90();
  PagedCase c = make_paged_case({{1, 1}, {100, 1}, {2048, 1}}, 64, KvElem::BF16, KvElem::BF16, 50);
  const Queries q = random_queries(c.tokens(), 51);
  const Selection sel = random_selection(c, 2048, 52);  // every row is 0..p: the dense set
  const Result sparse = gpu_mla(c, q, &sel.slots, 2048), dense = gpu_mla(c, q, nullptr, 0);
  // The same keys in the same order; the split schedule may differ, so BF16-output rounding.
  EXPECT_LT(worst_row_rel_error(sparse.out, dense.out, kCkvDim), 5e-3);
  EXPECT_LT(worst_lse_error(sparse.lse, dense.lse), 1e-3);
}

// ---- MlaSm90::run_device: FlashInfer's kernel over the schedule built on the device --------------

TEST(MlaAttentionTiny, DeviceScheduledDecodeMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    for (Impl i : {Impl::FlashInferDevice, Impl::FlashInferGraph}) check_dense({{1, 1}, {65, 1}, {200, 1}}, 64, e, 60, i);
}

TEST(MlaAttention, DeviceScheduledDecodeEveryPageSizeAndLengths1And100K) {
  FP4MOE_SKIP_WITHOUT_SM90();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    for (int64_t ps : {1, 16, 64}) check_dense(kDecodeShapes, ps, e, 61 + uint64_t(ps), Impl::FlashInferDevice);
    check_dense({{1, 1}, {100000, 1}, {3, 1}}, 64, e, 62, Impl::FlashInferGraph);
  }
  std::vector<RequestShape> many;  // 300 rows: one split each
  for (int r = 0; r < 300; ++r) many.push_back({1 + (r * 37) % 3000, 1});
  check_dense(many, 64, KvElem::BF16, 63, Impl::FlashInferDevice);
}

// Forced split counts (MlaDeviceRows::splits, the bench's sweep): 1, 2, 5 and 16 splits of rows
// shorter and longer than the splits' keys.
TEST(MlaAttention, DeviceScheduledDecodeWithForcedSplitsMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  for (int s : {1, 2, 5, 16}) {
    g_forced_splits = s;
    check_dense({{1, 1}, {3000, 1}, {700, 1}, {8192, 1}}, 64, KvElem::BF16, 70 + uint64_t(s), Impl::FlashInferDevice);
  }
  g_forced_splits = 0;
}

TEST(MlaAttention, DeviceScheduledSparseMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  check_sparse({{1, 1}, {40, 1}, {300, 2}}, 16, KvElem::BF16, 64, 64, Impl::FlashInferDevice);
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 65, Impl::FlashInferGraph);
}

TEST(MlaAttentionErrors, RunDeviceWithoutReserveOrWithMoreRowsIsAnError) {
  FP4MOE_SKIP_WITHOUT_SM90();
  at::MlaSm90 mla({kHeads, kSmScale, KvElem::BF16});
  at::MlaRunArgs a;
  at::MlaDeviceRows rows;
  rows.tokens = 4;
  EXPECT_THROW(mla.run_device(a, rows, nullptr), Error);
  mla.reserve_device(2);
  EXPECT_THROW(mla.run_device(a, rows, nullptr), Error);
  mla.reserve_device(4);
  rows.splits = -1;
  EXPECT_THROW(mla.run_device(a, rows, nullptr), Error);  // a negative split count
  rows.splits = 1000;
  EXPECT_THROW(mla.run_device(a, rows, nullptr), Error);  // more partial tiles than the buffer holds
  at::MlaSm90 heads128({128, kSmScale, KvElem::BF16});
  EXPECT_THROW(heads128.reserve_device(4), Error);
}

// ---- MlaDecodeMma (our decode kernel; tests/cuda/mla_decode_emu_test.cpp runs it on the CPU) --

bool mma_decode_available() {
  return cuda::device_available() && at::mla_decode_can_implement({kHeads, kSmScale, KvElem::FP8_E4M3}).empty();
}
#define FP4MOE_SKIP_WITHOUT_MMA_DECODE()                                                         \
  do {                                                                                           \
    if (!mma_decode_available()) GTEST_SKIP() << "needs a GPU with ~217 KB of shared memory per block"; \
  } while (0)

TEST(MlaDecodeMmaTiny, DecodeMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) check_dense({{1, 1}, {65, 1}, {200, 1}}, 64, e, 101, Impl::Mma);
}

// More rows than CTA slots: one item per row, so each streams 5-9 tiles through the 3-stage ring
// and the slot ring ahead of it (what step 50's racecheck of the *Tiny* suites then covers).
TEST(MlaDecodeMmaTiny, DecodeOfMoreRowsThanSlotsStreamsLongItems) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  const std::vector<RequestShape> rows(size_t(cuda::current_device().sm_count) + 2, RequestShape{260, 1});
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) check_dense(rows, 64, e, 103, Impl::Mma);
}

TEST(MlaDecodeMmaTiny, SparseMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) check_sparse({{1, 1}, {40, 1}, {300, 2}}, 16, e, 64, 102, Impl::Mma);
}

TEST(MlaDecodeMma, DecodeMatchesCpuEveryPageSize) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    for (int64_t ps : {1, 16, 64}) check_dense(kDecodeShapes, ps, e, 110 + uint64_t(ps), Impl::Mma);
}

TEST(MlaDecodeMma, DecodeLengths1And100KInOneBatch) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) check_dense({{1, 1}, {100000, 1}, {3, 1}}, 64, e, 120, Impl::Mma);
}

TEST(MlaDecodeMma, SparseTopK2048MatchesCpu) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 141, Impl::Mma);
}

TEST(MlaDecodeMma, Heads128MatchCpu) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) check_dense({{1, 1}, {700, 1}, {5000, 1}}, 64, e, 150, Impl::Mma, 128);
}

TEST(MlaDecodeMma, SparseWithTopKAtLeastContextEqualsDense) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  PagedCase c = make_paged_case({{1, 1}, {100, 1}, {2048, 1}}, 64, KvElem::FP8_E4M3, KvElem::BF16, 160);
  const Queries q = random_queries(c.tokens(), 161);
  const Selection sel = random_selection(c, 2048, 162);
  const Result sparse = gpu_mla(c, q, &sel.slots, 2048, Impl::Mma), dense = gpu_mla(c, q, nullptr, 0, Impl::Mma);
  EXPECT_LT(worst_row_rel_error(sparse.out, dense.out, kCkvDim), 5e-3);
  EXPECT_LT(worst_lse_error(sparse.lse, dense.lse), 1e-3);
}

// MlaDecodeMma::run_device (the runner's graph path): dense and sparse rows, eager and replayed
// from a CUDA graph, plain and with programmatic dependent launch (schedule -> decode -> merge,
// each launched while the one before may still run).
TEST(MlaDecodeMma, DeviceScheduledWithAndWithoutProgrammaticLaunchMatchCpu) {
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  for (const bool pdl : {false, true}) {
    g_pdl = pdl;
    for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
      check_dense({{1, 1}, {65, 1}, {4097, 1}, {100000, 1}}, 64, e, 130 + uint64_t(pdl), Impl::MmaDevice);
      check_dense({{1, 1}, {3000, 1}}, 16, e, 132 + uint64_t(pdl), Impl::MmaGraph);
      check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 134 + uint64_t(pdl),
                   Impl::MmaGraph);
    }
  }
  g_pdl = false;
}

// MlaSm90::run_device with programmatic dependent launch on its schedule kernel.
TEST(MlaAttention, DeviceScheduledWithProgrammaticLaunchMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_SM90();
  g_pdl = true;
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    check_dense({{1, 1}, {65, 1}, {4097, 1}, {100000, 1}}, 64, e, 140, Impl::FlashInferGraph);
    check_sparse({{5000, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 141, Impl::FlashInferGraph);
  }
  g_pdl = false;
}

// ---- MlaDecodeMma's wgmma variant (sm_90; the emulator test runs it on the CPU) ----
bool wgmma_decode_available() {
  return cuda::device_available() &&
         at::mla_decode_can_implement({kHeads, kSmScale, KvElem::FP8_E4M3}, at::DecodeMath::kWgmma).empty() &&
         at::mla_decode_can_implement({kHeads, kSmScale, KvElem::BF16}, at::DecodeMath::kWgmma).empty();
}
#define FP4MOE_SKIP_WITHOUT_WGMMA_DECODE()                                               \
  do {                                                                                   \
    if (!wgmma_decode_available()) GTEST_SKIP() << "needs sm_90 (wgmma) and ~215 KB of shared memory"; \
  } while (0)

TEST(MlaDecodeMmaTiny, WgmmaVariantDecodeAndSparseMatchCpu) {  // Tiny: under step 50's memcheck and racecheck
  FP4MOE_SKIP_WITHOUT_WGMMA_DECODE();
  const std::vector<RequestShape> rows(size_t(cuda::current_device().sm_count) + 2, RequestShape{260, 1});
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    check_dense({{1, 1}, {65, 1}, {200, 1}}, 64, e, 150, Impl::Wgmma);
    check_sparse({{1, 1}, {40, 1}, {300, 2}}, 16, e, 64, 151, Impl::Wgmma);
    check_dense(rows, 64, e, 152, Impl::Wgmma);  // one item per row: 9 tiles through both rings
  }
}

TEST(MlaDecodeWgmma, DecodeEveryPageSizeLongRowsAnd128HeadsMatchCpu) {
  FP4MOE_SKIP_WITHOUT_WGMMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    for (int64_t ps : {1, 16, 64}) check_dense(kDecodeShapes, ps, e, 153 + uint64_t(ps), Impl::Wgmma);
    check_dense({{1, 1}, {100000, 1}, {3, 1}}, 64, e, 154, Impl::Wgmma);
    check_dense({{70, 1}, {5000, 1}}, 16, e, 155, Impl::Wgmma, 128);
  }
}

TEST(MlaDecodeWgmma, SparseTopK2048AndDeviceScheduledGraphMatchCpu) {
  FP4MOE_SKIP_WITHOUT_WGMMA_DECODE();
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 156, Impl::Wgmma);
    check_dense({{1, 1}, {65, 1}, {4097, 1}, {100000, 1}}, 64, e, 157, Impl::WgmmaGraph);
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, e, 2048, 158, Impl::WgmmaGraph);
  }
}

// ---- MlaDecodeMma's warp-specialized wgmma variant (sm_90, FP8 cache; the emulator test runs it on the CPU) ----
bool wgmma_ws_decode_available() {
  return cuda::device_available() &&
         at::mla_decode_can_implement({kHeads, kSmScale, KvElem::FP8_E4M3}, at::DecodeMath::kWgmmaWs).empty();
}
#define FP4MOE_SKIP_WITHOUT_WGMMA_WS_DECODE()                                                                \
  do {                                                                                                       \
    if (!wgmma_ws_decode_available()) GTEST_SKIP() << "needs sm_90 (wgmma) and ~215 KB of shared memory"; \
  } while (0)

// The FP8 bound of the other kernels (tolerance(): 3e-2), the same math (FP16 Q, K, V, P); each
// case for both warp-specialized kernels (Q from shared memory / mostly from registers).
TEST(MlaDecodeMmaTiny, WgmmaWsVariantDecodeAndSparseMatchCpu) {  // Tiny: under step 50's memcheck and racecheck
  FP4MOE_SKIP_WITHOUT_WGMMA_WS_DECODE();
  const std::vector<RequestShape> rows(size_t(cuda::current_device().sm_count) + 2, RequestShape{260, 1});
  for (Impl impl : {Impl::WgmmaWs, Impl::WgmmaWsQRegs}) {
    check_dense({{1, 1}, {65, 1}, {200, 1}}, 64, KvElem::FP8_E4M3, 180, impl);
    check_sparse({{1, 1}, {40, 1}, {300, 2}}, 16, KvElem::FP8_E4M3, 64, 181, impl);
    check_dense(rows, 64, KvElem::FP8_E4M3, 182, impl);  // one item per row: 9 tiles through both rings
  }
}

TEST(MlaDecodeWgmmaWs, DecodeEveryPageSizeLongRowsAnd128HeadsMatchCpu) {
  FP4MOE_SKIP_WITHOUT_WGMMA_WS_DECODE();
  for (Impl impl : {Impl::WgmmaWs, Impl::WgmmaWsQRegs}) {
    for (int64_t ps : {1, 16, 64}) check_dense(kDecodeShapes, ps, KvElem::FP8_E4M3, 183 + uint64_t(ps), impl);
    check_dense({{1, 1}, {100000, 1}, {3, 1}}, 64, KvElem::FP8_E4M3, 184, impl);
    check_dense({{70, 1}, {5000, 1}}, 16, KvElem::FP8_E4M3, 185, impl, 128);
  }
}

TEST(MlaDecodeWgmmaWs, SparseTopK2048AndDeviceScheduledGraphMatchCpu) {
  FP4MOE_SKIP_WITHOUT_WGMMA_WS_DECODE();
  for (auto [impl, graph] :
       {std::pair{Impl::WgmmaWs, Impl::WgmmaWsGraph}, std::pair{Impl::WgmmaWsQRegs, Impl::WgmmaWsQRegsGraph}}) {
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, KvElem::FP8_E4M3, 2048, 186, impl);
    check_dense({{1, 1}, {65, 1}, {4097, 1}, {100000, 1}}, 64, KvElem::FP8_E4M3, 187, graph);
    check_sparse({{5000, 1}, {2048, 1}, {100, 1}, {40000, 1}, {3000, 4}}, 64, KvElem::FP8_E4M3, 2048, 188, graph);
  }
}

TEST(MlaDecodeMmaErrors, WgmmaWsVariantRefusesABf16Cache) {
  EXPECT_NE(at::mla_decode_can_implement({kHeads, kSmScale, KvElem::BF16}, at::DecodeMath::kWgmmaWs)
                .find("an FP8 E4M3 cache only"),
            std::string::npos);
  EXPECT_THROW(at::MlaDecodeMma({kHeads, kSmScale, KvElem::BF16}, at::DecodeMath::kWgmmaWs), Error);
  EXPECT_THROW(at::MlaDecodeMma({kHeads, kSmScale, KvElem::BF16}, at::DecodeMath::kWgmmaWsQRegs), Error);
}

TEST(MlaDecodeMmaErrors, BadInputIsAnError) {
  EXPECT_NE(at::mla_decode_can_implement({48, kSmScale, KvElem::BF16}).find("48 heads unsupported"), std::string::npos);
  EXPECT_NE(at::mla_decode_can_implement({64, kSmScale, KvElem::F32}).find("unsupported"), std::string::npos);
  FP4MOE_SKIP_WITHOUT_MMA_DECODE();
  at::MlaDecodeMma mla({kHeads, kSmScale, KvElem::BF16});
  at::MlaRunArgs a;
  EXPECT_THROW(mla.run(a, nullptr), Error);  // before plan
  PagedCase c = make_paged_case({{100, 2}}, 64, KvElem::BF16, KvElem::BF16, 170, false);
  try {
    mla.plan(c.batch(), c.page_size, c.num_pages, nullptr);
    FAIL() << "a 2-token prefill chunk accepted by the decode kernel";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exactly one"), std::string::npos) << e.what();
  }
  PagedCase d = make_paged_case({{100, 1}, {10, 1}}, 64, KvElem::BF16, KvElem::BF16, 171, false);
  d.page_indices[0] = int32_t(d.num_pages);
  EXPECT_THROW(mla.plan(d.batch(), d.page_size, d.num_pages, nullptr), Error);
  d.page_indices[0] = 0;
  mla.plan(d.batch(), d.page_size, d.num_pages, nullptr);
  PagedCase f = make_paged_case({{10, 1}}, 64, KvElem::FP8_E4M3, KvElem::BF16, 172, false);
  a.layer = f.layer();  // FP8 cache for a BF16 plan
  EXPECT_THROW(mla.run(a, nullptr), Error);
}

// ---- bad input ------------------------------------------------------------------------------

TEST(MlaAttentionErrors, UnsupportedHeadCountIsAnError) {
  EXPECT_NE(at::mla_can_implement({48, kSmScale, KvElem::BF16}, 90).find("48 heads unsupported"), std::string::npos);
  EXPECT_NE(at::mla_can_implement({64, kSmScale, KvElem::F32}, 90).find("unsupported"), std::string::npos);
  EXPECT_NE(at::mla_can_implement({64, kSmScale, KvElem::BF16}, 120).find("sm_90"), std::string::npos);
  FP4MOE_SKIP_WITHOUT_SM90();
  EXPECT_EQ(at::mla_can_implement({64, kSmScale, KvElem::BF16}, 90), "");
  try {
    at::MlaSm90 m({48, kSmScale, KvElem::BF16});
    FAIL() << "48 heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("48 heads unsupported"), std::string::npos) << e.what();
  }
}

TEST(MlaAttentionErrors, PageTableOutOfRangeIsAnError) {
  FP4MOE_SKIP_WITHOUT_SM90();
  PagedCase c = make_paged_case({{100, 1}, {10, 1}}, 64, KvElem::BF16, KvElem::BF16, 60, false);
  c.page_indices[1] = int32_t(c.num_pages);  // one past the pool
  at::MlaSm90 mla({kHeads, kSmScale, KvElem::BF16});
  try {
    mla.plan(c.batch(), c.page_size, c.num_pages, nullptr);
    FAIL() << "out-of-range page accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page"), std::string::npos) << e.what();
  }
  c.page_indices[1] = -1;
  EXPECT_THROW(mla.plan(c.batch(), c.page_size, c.num_pages, nullptr), Error);
}

TEST(MlaAttentionErrors, TokensNotAtTheEndOfTheContextAreAnError) {
  FP4MOE_SKIP_WITHOUT_SM90();
  PagedCase c = make_paged_case({{100, 2}}, 64, KvElem::BF16, KvElem::BF16, 61, false);
  c.positions[0] = 10;  // a gap: the kernel's causal rule cannot express it
  at::MlaSm90 mla({kHeads, kSmScale, KvElem::BF16});
  EXPECT_THROW(mla.plan(c.batch(), c.page_size, c.num_pages, nullptr), Error);
}

TEST(MlaAttentionErrors, RunBeforePlanAndMismatchedCacheAreErrors) {
  FP4MOE_SKIP_WITHOUT_SM90();
  at::MlaSm90 mla({kHeads, kSmScale, KvElem::FP8_E4M3});
  at::MlaRunArgs a;
  EXPECT_THROW(mla.run(a, nullptr), Error);
  PagedCase c = make_paged_case({{10, 1}}, 64, KvElem::BF16, KvElem::BF16, 62, false);
  mla.plan(c.batch(), c.page_size, c.num_pages, nullptr);
  a.layer = c.layer();  // BF16 cache for an FP8 plan
  EXPECT_THROW(mla.run(a, nullptr), Error);
}

TEST(MlaAttentionErrors, TooManyQueryTilesIsAnError) {
  FP4MOE_SKIP_WITHOUT_SM90();
  PagedCase c = make_paged_case({{40000, 40000}}, 64, KvElem::BF16, KvElem::BF16, 63, false);
  at::MlaSm90 mla({kHeads, kSmScale, KvElem::BF16});
  try {
    mla.plan(c.batch(), c.page_size, c.num_pages, nullptr);
    FAIL() << "40000-token prefill accepted in one plan";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::test
