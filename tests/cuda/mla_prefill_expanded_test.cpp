// MlaPrefillExpandedSm90 (K/V expanded by kv_b_proj, FlashInfer FA3 ragged prefill) against the
// CPU backend's absorbed attention: with q_latent_h = W_UK_hᵀ · q_nope_h the absorbed output
// o_latent satisfies out_h = W_UV_h · o_latent_h, which is what the expanded form computes.
// Chunked causal prefill batches, BF16 (< 1e-2) and FP8 (< 3e-2) caches, page sizes 16 / 64.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/attention/mla_cpu.hpp"
#include "cuda/attention/mla_prefill.hpp"
#include "cuda/attention_test_util.hpp"

namespace fp4moe::test {
namespace {

namespace at = cuda::attention;
constexpr int kHeads = 64;
constexpr int kNope = at::kQkNopeDim, kV = at::kVDim, kRows = kNope + kV;  // kv_b_proj rows per head
constexpr float kSmScale = 0.0625f;


void check_expanded(const std::vector<RequestShape>& shapes, int64_t page_size, KvElem elem, uint64_t seed) {
  FP4MOE_SKIP_WITHOUT_SM90();
  PagedCase c = make_paged_case(shapes, page_size, elem, KvElem::BF16, seed);
  const int64_t T = c.tokens();
  const auto q = random_bf16(size_t(T) * kHeads * at::kExpandedHeadDim, seed + 1, 0.5f);
  const auto w = random_bf16(size_t(kHeads) * kRows * kCkvDim, seed + 2, 1.0f / std::sqrt(float(kCkvDim)));

  // CPU: absorb W_UK into the query, attend in the latent space, apply W_UV.
  std::vector<float> q_lat(size_t(T) * kHeads * kCkvDim, 0.f), q_rope(size_t(T) * kHeads * kKpeDim);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < kHeads; ++h) {
      const float* qh = &q.f[(size_t(t) * kHeads + size_t(h)) * at::kExpandedHeadDim];
      float* ql = &q_lat[(size_t(t) * kHeads + size_t(h)) * kCkvDim];
      for (int i = 0; i < kNope; ++i) {
        const float* wr = &w.f[(size_t(h) * kRows + size_t(i)) * kCkvDim];
        for (int cc = 0; cc < kCkvDim; ++cc) ql[cc] += qh[i] * wr[cc];
      }
      for (int i = 0; i < kKpeDim; ++i) q_rope[(size_t(t) * kHeads + size_t(h)) * kKpeDim + size_t(i)] = qh[kNope + i];
    }
  std::vector<float> o_lat(size_t(T) * kHeads * kCkvDim), lse(size_t(T) * kHeads);
  cpu::MlaAttentionParams p;
  p.num_heads = kHeads;
  p.sm_scale = kSmScale;
  cpu::mla_attention_cpu(c.layer(), c.batch(), q_lat.data(), q_rope.data(), p, o_lat.data(), lse.data());
  std::vector<float> ref(size_t(T) * kHeads * kV, 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < kHeads; ++h)
      for (int j = 0; j < kV; ++j) {
        const float* wr = &w.f[(size_t(h) * kRows + size_t(kNope + j)) * kCkvDim];
        const float* ol = &o_lat[(size_t(t) * kHeads + size_t(h)) * kCkvDim];
        double acc = 0;
        for (int cc = 0; cc < kCkvDim; ++cc) acc += double(wr[cc]) * ol[cc];
        ref[(size_t(t) * kHeads + size_t(h)) * kV + size_t(j)] = float(acc);
      }

  DeviceCache dc(c);
  DeviceArray<uint16_t> dq(q.bits), dw(w.bits), out(size_t(T) * kHeads * kV);  // out poisoned
  DeviceArray<float> dlse(size_t(T) * kHeads);
  DeviceArray<int32_t> pages(c.page_indices);
  int64_t kv_tokens = 0;
  for (int32_t l : c.kv_len) kv_tokens += l;
  at::MlaPrefillExpandedSm90 op(kHeads, kSmScale, kv_tokens);
  op.plan(c.batch(), c.page_size, c.num_pages, nullptr);
  at::MlaPrefillRunArgs a;
  a.q = dq.ptr;
  a.kv_b_proj = dw.ptr;
  a.layer = dc.L;
  a.page_indices = pages.ptr;
  a.out = out.ptr;
  a.lse = dlse.ptr;
  op.run(a, nullptr);
  const auto got = bf16_to_floats(out.download());
  const double tol = elem == KvElem::BF16 ? 1e-2 : 3e-2;
  EXPECT_LT(worst_row_rel_error(got, ref, kV), tol) << "page_size " << page_size << " " << kv_elem_name(elem);
  EXPECT_LT(worst_lse_error(dlse.download(), lse, M_LN2), 2e-2) << "lse (base 2 on the GPU)";
}

TEST(MlaPrefillExpandedTiny, MatchesAbsorbedCpu) { check_expanded({{70, 3}, {1, 1}, {20, 20}}, 16, KvElem::BF16, 1); }

TEST(MlaPrefillExpanded, ChunkedPrefillMatchesAbsorbedCpuBf16) {
  check_expanded({{300, 37}, {128, 128}, {1, 1}, {1000, 64}}, 64, KvElem::BF16, 2);
  check_expanded({{129, 129}, {517, 100}}, 16, KvElem::BF16, 3);
}

TEST(MlaPrefillExpanded, ChunkedPrefillMatchesAbsorbedCpuFp8) {
  check_expanded({{300, 37}, {128, 128}, {1000, 64}}, 64, KvElem::FP8_E4M3, 4);
}

TEST(MlaPrefillExpandedErrors, TooManyContextTokensIsAnError) {
  FP4MOE_SKIP_WITHOUT_SM90();
  PagedCase c = make_paged_case({{100, 10}}, 64, KvElem::BF16, KvElem::BF16, 5, false);
  at::MlaPrefillExpandedSm90 op(kHeads, kSmScale, 99);
  EXPECT_THROW(op.plan(c.batch(), c.page_size, c.num_pages, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe::test
