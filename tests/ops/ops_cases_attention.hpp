// The backend-ops table, part 2: the paged-cache ops (kv_append_bf16 / _fp8, mla_attention_warp_bf16
// / _fp8, indexer_scores_warp_bf16 / _fp8) against cpu/attention, and the table of every row (op_rows).
#pragma once

#include "format/codecs.hpp"
#include "ops/ops_cases.hpp"

namespace fp4moe::test::ops {

// A latent cache (and index keys) for a batch, BF16 or FP8 E4M3 (the per-array scales of
// kFp8Scales: codes of values in about [-1, 1], none saturated): every slot random (a slot an op
// reads is defined, wherever it is) or poisoned (BF16 NaN, E4M3 code 0x7F: NaN), in host vectors
// and in backend buffers, with both views. ckv_at / kpe_at / idx_at: element i as the ops read it.
inline constexpr float kFp8Scales[3] = {0.0087f, 0.0113f, 0.0061f};  // ckv, kpe, index_k

template <class B>
struct CacheCase {
  bool fp8;
  std::vector<uint16_t> ckv, kpe, idx;    // BF16
  std::vector<uint8_t> ckv8, kpe8, idx8;  // FP8 codes
  typename B::template Buf<uint16_t> d_ckv, d_kpe, d_idx;
  typename B::template Buf<uint8_t> d_ckv8, d_kpe8, d_idx8;
  KvLayerView host{}, dev{};
  static std::vector<uint16_t> bf16s(Rng& rng, bool on, bool poison, size_t n) {
    if (!on) return {};
    return poison ? std::vector<uint16_t>(n, kPoisonBf16) : rand_bf16(rng, n, -1.0f, 1.0f);
  }
  static std::vector<uint8_t> codes(Rng& rng, bool on, bool poison, size_t n, float scale) {
    if (!on) return {};
    std::vector<uint8_t> c(n, uint8_t(0x7F));
    if (!poison)
      for (uint8_t& x : c) x = e4m3_from_float(rng.uni(-1.0f, 1.0f) / scale);
    return c;
  }
  CacheCase(Rng& rng, const PagedBatch& b, int C, int Rd, int I, bool poison, bool fp8_cache = false)
      : fp8(fp8_cache),
        ckv(bf16s(rng, !fp8, poison, size_t(b.num_pages) * b.page_size * C)),
        kpe(bf16s(rng, !fp8, poison, size_t(b.num_pages) * b.page_size * Rd)),
        idx(bf16s(rng, !fp8, poison, size_t(b.num_pages) * b.page_size * I)),
        ckv8(codes(rng, fp8, poison, size_t(b.num_pages) * b.page_size * C, kFp8Scales[0])),
        kpe8(codes(rng, fp8, poison, size_t(b.num_pages) * b.page_size * Rd, kFp8Scales[1])),
        idx8(codes(rng, fp8, poison, size_t(b.num_pages) * b.page_size * I, kFp8Scales[2])),
        d_ckv(B::up(ckv)), d_kpe(B::up(kpe)), d_idx(B::up(idx)),
        d_ckv8(B::up(ckv8)), d_kpe8(B::up(kpe8)), d_idx8(B::up(idx8)) {
    host.num_pages = dev.num_pages = b.num_pages;
    host.page_size = dev.page_size = b.page_size;
    host.ckv_dim = dev.ckv_dim = C;
    host.kpe_dim = dev.kpe_dim = Rd;
    host.index_dim = dev.index_dim = I;
    if (fp8) {
      host.elem = dev.elem = host.index_elem = dev.index_elem = KvElem::FP8_E4M3;
      host.ckv_scale = dev.ckv_scale = kFp8Scales[0];
      host.kpe_scale = dev.kpe_scale = kFp8Scales[1];
      host.index_scale = dev.index_scale = kFp8Scales[2];
      host.ckv = ckv8.data();
      host.kpe = kpe8.data();
      host.index_k = I ? idx8.data() : nullptr;
      dev.ckv = d_ckv8.p();
      dev.kpe = d_kpe8.p();
      dev.index_k = I ? static_cast<void*>(d_idx8.p()) : nullptr;
    } else {
      host.ckv = ckv.data();
      host.kpe = kpe.data();
      host.index_k = I ? idx.data() : nullptr;
      dev.ckv = d_ckv.p();
      dev.kpe = d_kpe.p();
      dev.index_k = I ? static_cast<void*>(d_idx.p()) : nullptr;
    }
  }
  double ckv_at(size_t i) const { return fp8 ? double(e4m3_to_float(ckv8[i])) * kFp8Scales[0] : bf16_to_float(ckv[i]); }
  double kpe_at(size_t i) const { return fp8 ? double(e4m3_to_float(kpe8[i])) * kFp8Scales[1] : bf16_to_float(kpe[i]); }
  double idx_at(size_t i) const { return fp8 ? double(e4m3_to_float(idx8[i])) * kFp8Scales[2] : bf16_to_float(idx[i]); }
};

// The step's keys into their slots, so that the whole cache (written slots and the poisoned
// rest) equals cpu::kv_append_cpu's bit for bit: BF16 copies, or E4M3 codes of x · (1 / scale)
// (the same float products and the same RNE-saturating rounding on both sides). Rows as the
// runner passes them: latent and rope key in one [T, C + Rd] row, the index key contiguous.
// FP8: inputs up to ±4 over scales of 0.006-0.011 reach ±650, so some codes saturate to ±448.
template <class B>
void kv_append_case(bool with_index, int page_size, uint64_t seed, bool fp8 = false) {
  Rng rng(seed);
  const int C = 64, Rd = 32, I = with_index ? 48 : 0;
  const PagedBatch b = make_batch(rng, {7, 40, 1, 19}, {7, 1, 1, 5}, page_size);
  CacheCase<B> cache(rng, b, C, Rd, I, /*poison=*/true, fp8);
  const float amp = fp8 ? 4.0f : 2.0f;
  const std::vector<uint16_t> kv = rand_bf16(rng, size_t(b.tokens) * (C + Rd), -amp, amp),
                              ik = rand_bf16(rng, size_t(b.tokens) * std::max(I, 1), -amp, amp);
  auto dkv = B::up(kv);
  auto dik = B::up(ik);
  BackendBatch<B> db(b);
  if (fp8)
    B::kv_append_fp8(cache.dev, db.view, dkv.p(), C + Rd, dkv.p() + C, C + Rd, with_index ? dik.p() : nullptr);
  else
    B::kv_append_bf16(cache.dev, db.view, dkv.p(), C + Rd, dkv.p() + C, C + Rd, with_index ? dik.p() : nullptr);
  std::vector<float> ckv(size_t(b.tokens) * C), kpe(size_t(b.tokens) * Rd);
  for (int t = 0; t < b.tokens; ++t) {
    for (int i = 0; i < C; ++i) ckv[size_t(t * C + i)] = bf16_to_float(kv[size_t(t * (C + Rd) + i)]);
    for (int i = 0; i < Rd; ++i) kpe[size_t(t * Rd + i)] = bf16_to_float(kv[size_t(t * (C + Rd) + C + i)]);
  }
  const std::vector<float> ik32 = widen(ik);
  cpu::kv_append_cpu(cache.host, b.host(), ckv.data(), kpe.data(), with_index ? ik32.data() : nullptr);
  if (fp8) {
    int saturated = 0;
    for (uint8_t c : cache.ckv8) saturated += (c & 0x7F) == 0x7E;
    EXPECT_GT(saturated, 0) << "kv_append_fp8: no latent code reached ±448 (the saturation is not exercised)";
    expect_equal("kv_append_fp8: latent cache", B::down(cache.d_ckv8), cache.ckv8);
    expect_equal("kv_append_fp8: rope key cache", B::down(cache.d_kpe8), cache.kpe8);
    expect_equal("kv_append_fp8: index key cache", B::down(cache.d_idx8), cache.idx8);
  } else {
    expect_equal("kv_append_bf16: latent cache", B::down(cache.d_ckv), cache.ckv);
    expect_equal("kv_append_bf16: rope key cache", B::down(cache.d_kpe), cache.kpe);
    expect_equal("kv_append_bf16: index key cache", B::down(cache.d_idx), cache.idx);
  }
}

// Absorbed MLA → BF16, per (token, head) row. Scores: FP32 dot products of C + Rd terms in
// another order than the reference's (each side off by <= (C + Rd) · 2^-24 · scale · Σ|q·k| =
// δ per key); the softmax moves by at most 2δ relative, each weight by __expf's error (<= 40 ulp
// for arguments down to −30); the FP32 running sums of n keys add n · 2^-24; all of it times
// max|ckv| in each of the C values (√C in L2); then the BF16 rounding of the output (2^-9 of
// it). The reference (FP32) has the same kind of error: bound = 3 × the sum. FP8 cache: both
// sides decode the same codes exactly (e4m3 · scale is one FP32 rounding, the same on both), so
// the bound is the same derivation over the decoded values.
template <class B>
void mla_case(bool sparse, int heads, int C, int Rd, const std::vector<int32_t>& ctx, const std::vector<int32_t>& fresh,
              int topk_k, uint64_t seed, bool fp8 = false) {
  Rng rng(seed);
  const PagedBatch b = make_batch(rng, ctx, fresh, 16);
  CacheCase<B> cache(rng, b, C, Rd, 0, /*poison=*/false, fp8);
  const int T = b.tokens, QK = Rd + 16;  // q_pe inside a wider [T, heads, QK] row, at offset 16 (the runner's q)
  const float scale = 1.0f / std::sqrt(float(C + Rd)) * 2.0f;
  const std::vector<uint16_t> ql = rand_bf16(rng, size_t(T) * heads * C, -1.0f, 1.0f),
                              qall = rand_bf16(rng, size_t(T) * heads * QK, -1.0f, 1.0f);
  // Top-k rows: min(topk_k, pos + 1) distinct causal positions (some replaced by −1), −1 after.
  std::vector<int32_t> topk_pos(size_t(T) * topk_k, -1), topk_slot(size_t(T) * topk_k, -1);
  if (sparse)
    for (int t = 0; t < T; ++t) {
      const int pos = b.positions[size_t(t)], r = b.token_req[size_t(t)], n = std::min(topk_k, pos + 1);
      std::vector<int32_t> cand(static_cast<size_t>(pos + 1));
      std::iota(cand.begin(), cand.end(), 0);
      std::shuffle(cand.begin(), cand.end(), rng.g);
      for (int j = 0; j < n; ++j) {
        const int32_t p = rng.integer(0, 7) == 0 ? -1 : cand[size_t(j)];
        topk_pos[size_t(t * topk_k + j)] = p;
        topk_slot[size_t(t * topk_k + j)] = p < 0 ? -1 : int32_t(kv_slot(b.host(), b.page_size, r, p));
      }
    }
  auto dql = B::up(ql);
  auto dq = B::up(qall);
  auto dslots = B::up(topk_slot);
  auto dout = B::up(std::vector<uint16_t>(size_t(T) * heads * C, kPoisonBf16));
  BackendBatch<B> db(b);
  (fp8 ? B::mla_attention_warp_fp8 : B::mla_attention_warp_bf16)(dql.p(), dq.p() + 16, int64_t(heads) * QK, QK,
                                                                  cache.dev, db.view, heads, scale,
                                                                  sparse ? dslots.p() : nullptr, topk_k, dout.p());
  std::vector<float> qpe(size_t(T) * heads * Rd);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < Rd; ++i)
        qpe[size_t((t * heads + h) * Rd + i)] = bf16_to_float(qall[size_t((t * heads + h) * QK + 16 + i)]);
  const std::vector<float> ql32 = widen(ql);
  cpu::MlaAttentionParams prm;
  prm.num_heads = heads;
  prm.sm_scale = scale;
  prm.topk = sparse ? topk_pos.data() : nullptr;
  prm.topk_k = sparse ? topk_k : 0;
  std::vector<float> ref(size_t(T) * heads * C);
  cpu::mla_attention_cpu(cache.host, b.host(), ql32.data(), qpe.data(), prm, ref.data(), nullptr);
  const std::string name = std::string(fp8 ? "mla_attention_warp_fp8" : "mla_attention_warp_bf16") +
                           (sparse ? " (top-k)" : " (dense)");
  expect_rows_close(name,
                    widen(B::down(dout)), C, ref, int64_t(T) * heads, C, [&](int64_t row, double n) {
                      const int t = int(row / heads), h = int(row % heads), pos = b.positions[size_t(t)],
                                r = b.token_req[size_t(t)];
                      double delta = 0.0, vmax = 0.0;
                      int keys = 0;
                      for (int j = 0; j < (sparse ? std::min(topk_k, pos + 1) : pos + 1); ++j) {
                        const int p = sparse ? topk_pos[size_t(t * topk_k + j)] : j;
                        if (p < 0) continue;
                        ++keys;
                        const int64_t s = kv_slot(b.host(), b.page_size, r, p);
                        double dot = 0.0;
                        for (int i = 0; i < C; ++i) {
                          const double kv = cache.ckv_at(size_t(s * C + i));
                          dot += std::abs(ql32[size_t((t * heads + h) * C + i)] * kv);
                          vmax = std::max(vmax, std::abs(kv));
                        }
                        for (int i = 0; i < Rd; ++i)
                          dot += std::abs(qpe[size_t((t * heads + h) * Rd + i)] *
                                          cache.kpe_at(size_t(s * Rd + i)));
                        delta = std::max(delta, (C + Rd) * kF32Rel * scale * dot);
                      }
                      return 3.0 * (kBf16Rel * n + std::sqrt(double(C)) * vmax * (2.0 * (delta + 40.0 * kF32Rel) + keys * kF32Rel));
                    });
}

// Indexer scores (FP32), per value: each head's dot product of dim terms is off by
// dim · 2^-24 · scale · Σ|q·k| (either side's order), weighted by |w_h|; the head sum adds
// heads · 2^-24 · Σ|w_h · ReLU(.)|. Bound = 3 × the sum (the reference is FP32 too; FP8 keys:
// the same over the decoded keys, which both sides decode exactly alike). Columns
// past each token's position are not the op's: they stay poisoned.
template <class B>
void indexer_case(int heads, int dim, const std::vector<int32_t>& ctx, const std::vector<int32_t>& fresh, uint64_t seed,
                  bool fp8 = false) {
  Rng rng(seed);
  const PagedBatch b = make_batch(rng, ctx, fresh, 16);
  CacheCase<B> cache(rng, b, 32, 32, dim, /*poison=*/false, fp8);
  const int T = b.tokens, max_ctx = *std::max_element(ctx.begin(), ctx.end());
  const int64_t stride = max_ctx + 5;
  const float scale = 1.0f / std::sqrt(float(dim));
  const std::vector<uint16_t> q = rand_bf16(rng, size_t(T) * heads * dim, -1.0f, 1.0f);
  const std::vector<float> w = rand_f32(rng, size_t(T) * heads, -1.0f, 1.0f), q32 = widen(q);
  auto dq = B::up(q);
  auto dw = B::up(w);
  auto ds = B::up(std::vector<float>(size_t(T) * stride, kPoisonF32));
  BackendBatch<B> db(b);
  (fp8 ? B::indexer_scores_warp_fp8 : B::indexer_scores_warp_bf16)(dq.p(), dw.p(), cache.dev, db.view, heads, dim, scale,
                                                                    max_ctx, ds.p(), stride);
  const std::vector<float> got = B::down(ds);
  std::vector<float> ref(size_t(T) * stride);
  cpu::IndexerParams prm;
  prm.n_heads = heads;
  prm.softmax_scale = scale;
  cpu::indexer_scores_cpu(cache.host, b.host(), q32.data(), w.data(), prm, ref.data(), stride);
  int failures = 0;
  for (int t = 0; t < T && failures < 5; ++t) {
    const int pos = b.positions[size_t(t)], r = b.token_req[size_t(t)];
    for (int j = 0; j < stride && failures < 5; ++j) {
      const float g = got[size_t(t * stride + j)];
      if (j > pos) {
        if (!std::isnan(g)) ++failures, ADD_FAILURE() << "indexer scores: token " << t << " wrote column " << j << " past its position " << pos;
        continue;
      }
      const int64_t s = kv_slot(b.host(), b.page_size, r, j);
      double bound = 0.0, sum = 0.0;
      for (int h = 0; h < heads; ++h) {
        double dot = 0.0, absdot = 0.0;
        for (int i = 0; i < dim; ++i) {
          const double p = double(q32[size_t((t * heads + h) * dim + i)]) * cache.idx_at(size_t(s * dim + i));
          dot += p;
          absdot += std::abs(p);
        }
        const double wh = std::abs(w[size_t(t * heads + h)]);
        bound += wh * dim * kF32Rel * scale * absdot;
        sum += wh * std::max(0.0, dot * scale);
      }
      bound = 3.0 * (bound + heads * kF32Rel * sum) + 1e-30;
      const double ref_v = ref[size_t(t * stride + j)];
      if (std::isnan(g) || !(std::abs(g - ref_v) <= bound))
        ++failures, ADD_FAILURE() << "indexer scores: token " << t << " key " << j << ": got " << g << ", reference "
                                  << ref_v << ", bound " << bound;
    }
  }
}

// ---- the table ---------------------------------------------------------------------------------
struct OpRow {
  std::string name;  // gtest-safe: [A-Za-z0-9_]
  std::function<void()> run;
};

// Every row once; big adds GPU-sized shapes (GLM-5's dims, grid-stride loops past their grid
// caps) that the emulator would take minutes over.
template <class B>
std::vector<OpRow> op_rows(bool big) {
  std::vector<OpRow> v;
  auto add = [&](std::string n, std::function<void()> f) { v.push_back({std::move(n), std::move(f)}); };
  add("rms_norm_f32_in", [] { rms_norm_case<B>(false, 5, 300, 7, 1); });
  add("rms_norm_bf16_in", [] { rms_norm_case<B>(true, 4, 513, 0, 2); });
  add("rms_norm_small_values_eps_matters", [] { rms_norm_case<B>(true, 3, 256, 0, 32, 3e-3f); });
  add("rms_norm_bf16_in_dim1", [] { rms_norm_case<B>(true, 3, 1, 2, 3); });
  // The register form's vector paths (16-byte-aligned rows), with and without a scalar tail, and
  // its CTA sizes at GLM-5's dims; past its largest dim, the strided form; that form as v0.
  add("rms_norm_f32_in_glm5_hidden_b1", [] { rms_norm_case<B>(false, 1, 6144, 0, 40, 3.0f, 0); });
  add("rms_norm_f32_in_glm5_hidden_b2", [] { rms_norm_case<B>(false, 2, 6144, 4, 41, 3.0f, 8); });
  add("rms_norm_f32_in_7168_b7", [] { rms_norm_case<B>(false, 7, 7168, 0, 42, 3.0f, 0); });
  add("rms_norm_bf16_in_q_a_b1", [] { rms_norm_case<B>(true, 1, 1536, 0, 43, 3.0f, 0); });
  add("rms_norm_bf16_in_q_a_b7", [] { rms_norm_case<B>(true, 7, 1536, 8, 44, 3.0f, 16); });
  add("rms_norm_f32_in_vec_rows_tail", [] { rms_norm_case<B>(false, 3, 4099, 1, 45, 3.0f, 5); });
  add("rms_norm_bf16_in_vec_rows_tail", [] { rms_norm_case<B>(true, 3, 1541, 3, 46, 3.0f, 3); });
  add("rms_norm_bf16_in_x_vec_y_not", [] { rms_norm_case<B>(true, 2, 2048, 0, 47, 3.0f, 1); });
  add("rms_norm_f32_in_y_vec_x_not", [] { rms_norm_case<B>(false, 2, 2048, 1, 48, 3.0f, 0); });
  add("rms_norm_f32_in_every_chunk_count", [] { rms_norm_case<B>(false, 2, 16384, 0, 49, 3.0f, 0); });
  add("rms_norm_f32_in_past_register_form", [] { rms_norm_case<B>(false, 2, 16387, 1, 50, 3.0f, 5); });
  add("rms_norm_bf16_in_64_rows", [] { rms_norm_case<B>(true, 64, 512, 0, 51, 3.0f, 0); });
  add("rms_norm_bf16_in_1024_rows", [] { rms_norm_case<B>(true, 1024, 64, 0, 52, 3.0f, 0); });
  add("rms_norm_f32_in_glm5_hidden_b64", [] { rms_norm_case<B>(false, 64, 6144, 0, 55, 3.0f, 0); });
  add("rms_norm_f32_in_glm5_hidden_b1024", [] { rms_norm_case<B>(false, 1024, 6144, 0, 56, 3.0f, 0); });
  add("rms_norm_bf16_in_place_q_a", [] { rms_norm_in_place_case<B>(3, 1536, 57); });
  add("rms_norm_bf16_in_place_odd_dim", [] { rms_norm_in_place_case<B>(2, 1537, 58); });
  add("rms_norm_v0_f32_in", [] { rms_norm_case<B>(false, 3, 300, 7, 53, 3.0f, 3, true); });
  add("rms_norm_v0_bf16_in", [] { rms_norm_case<B>(true, 2, 1536, 0, 54, 3.0f, 0, true); });
  add("layer_norm", [] { layer_norm_case<B>(false, 4, 128, 4); });
  add("layer_norm_in_place", [] { layer_norm_case<B>(true, 3, 200, 5); });
  add("rope_interleaved_mla_query", [] { rope_case<B>(true, 3, 4, 48, 16, 32, 1.0f, 6); });
  add("rope_halves_yarn_factor", [] { rope_case<B>(false, 4, 3, 40, 8, 32, 1.25f, 7); });
  add("rope_one_head_whole_row", [] { rope_case<B>(true, 5, 1, 64, 0, 64, 1.0f, 8); });
  add("rope_glm5_mla_query_b1", [] { rope_case<B>(true, 1, 64, 256, 192, 64, 1.0f, 87); });
  add("rope_two_rounds_halves", [] { rope_case<B>(false, 2, 100, 80, 16, 64, 1.25f, 88); });
  add("embed_rows_bf16_table", [] { embed_case<B>(false, 6, 300, 50, 9); });
  add("embed_rows_f32_table", [] { embed_case<B>(true, 5, 257, 40, 10); });
  add("gather_rows", [] { gather_case<B>(5, 300, 9, 11); });
  // The vector forms (H a multiple of 4 / dim of 8), several CTAs per row, and scalar ones.
  add("embed_rows_bf16_table_glm5_hidden", [] { embed_case<B>(false, 2, 6144, 20, 80); });
  add("embed_rows_f32_table_vec_many_ctas", [] { embed_case<B>(true, 3, 4100, 9, 81); });
  add("embed_rows_bf16_table_h_not_4", [] { embed_case<B>(false, 2, 4098, 7, 82); });
  add("embed_rows_bf16_table_64_rows", [] { embed_case<B>(false, 64, 512, 70, 83); });
  add("gather_rows_glm5_hidden", [] { gather_case<B>(1, 6144, 3, 84); });
  add("gather_rows_vec_many_ctas", [] { gather_case<B>(7, 8200, 9, 85); });
  add("gather_rows_dim_not_8", [] { gather_case<B>(3, 6148, 4, 86); });
  add("embed_rows_v0", [] { embed_case<B>(false, 3, 6144, 20, 90, true); });
  add("gather_rows_v0", [] { gather_case<B>(3, 6144, 5, 91, true); });
  add("silu_mul_strided", [] { silu_mul_case<B>(3, 700, 6, 12); });
  add("add_into_bf16", [] { add_into_case<B>(true, 3001, 13); });
  add("add_into_f32", [] { add_into_case<B>(false, 3001, 14); });
  add("bf16_f32_conversions", [] { convert_case<B>(2049, 15); });
  add("moe_dense_combine_f32", [] { dense_combine_case<B>(false, 4, 3, 300, 6, 16); });
  add("moe_dense_combine_f32_shared", [] { dense_combine_case<B>(true, 3, 2, 257, 5, 17); });
  add("argmax_rows_f32_short_rows", [] { argmax_case<B>(700, 18); });
  add("argmax_rows_f32_long_rows", [] { argmax_case<B>(5000, 19); });
  add("argmax_rows_f32_odd_vocab_patterns", [] { argmax_case<B>(4103, 60, 11); });
  add("argmax_rows_f32_tiny_vocabs", [] {
    for (int v : {1, 2, 3, 5, 7}) argmax_case<B>(v, 61 + uint64_t(v), 11);
  });
  add("argmax_rows_f32_split_glm5_vocab_b1", [] { argmax_case<B>(154880, 62, 1, 1); });
  add("argmax_rows_f32_split_glm5_vocab_b2", [] { argmax_case<B>(154880, 63, 2, 1); });
  add("argmax_rows_f32_split_odd_vocab_b7", [] { argmax_case<B>(154877, 64, 7, 1); });
  add("argmax_rows_f32_split_patterns", [] { argmax_case<B>(20001, 65, 11, 1); });
  add("argmax_rows_f32_split_64_rows", [] { argmax_case<B>(9001, 66, 64, 1); });
  add("argmax_rows_f32_split_glm5_vocab_b64", [] { argmax_case<B>(154880, 71, 64, 1); });
  add("argmax_rows_f32_split_short_vocab", [] { argmax_case<B>(4095, 67, 3, 1); });
  add("argmax_rows_f32_workspace_many_rows", [] { argmax_case<B>(301, 68, 200, 1); });
  add("argmax_rows_f32_one_cta_glm5_vocab", [] { argmax_case<B>(154880, 69, 2, 0); });
  add("argmax_rows_f32_v0", [] { argmax_case<B>(5001, 70, 11, 2); });
  add("token_bitmask_f32", [] { token_bitmask_case<B>(2053, 3, 32); });
  add("token_bitmask_f32_one_word", [] { token_bitmask_case<B>(17, 0, 33); });
  add("count_experts", [] { count_experts_case<B>(37, 4, 600, 20); });
  add("chunk_qo_indptr", [] { chunk_qo_case<B>(9, 4, 7, 21); });
  add("chunk_qo_indptr_many_requests", [] { chunk_qo_case<B>(300, 100, 250, 22); });
  add("greedy_advance", [] { greedy_advance_case<B>(false, 9, 5, 23); });
  add("greedy_advance_sampled", [] { greedy_advance_case<B>(true, 9, 5, 24); });
  add("spec_accept_greedy", [] { spec_accept_case<B>(37, 4, 25); });
  add("spec_accept_greedy_one_draft", [] { spec_accept_case<B>(9, 1, 26); });
  add("copy_indexed_i32", [] { copy_indexed_case<B>(300, true, true, 27); });
  add("copy_indexed_i32_plain", [] { copy_indexed_case<B>(5, false, false, 28); });
  add("copy_indexed_i32_src", [] { copy_indexed_case<B>(77, false, true, 29); });
  add("kv_append_bf16", [] { kv_append_case<B>(false, 16, 25); });
  add("kv_append_bf16_index_keys", [] { kv_append_case<B>(true, 4, 26); });
  add("mla_attention_warp_bf16_dense", [] { mla_case<B>(false, 2, 64, 32, {5, 37}, {5, 2}, 0, 27); });
  add("mla_attention_warp_bf16_topk", [] { mla_case<B>(true, 2, 64, 48, {9, 40}, {2, 2}, 12, 28); });
  add("indexer_scores_warp_bf16", [] { indexer_case<B>(4, 64, {30, 200}, {3, 1}, 29); });
  add("indexer_scores_warp_bf16_dim128", [] { indexer_case<B>(2, 128, {150}, {2}, 30); });
  add("indexer_scores_warp_bf16_dim48", [] { indexer_case<B>(3, 48, {20, 9}, {2, 1}, 31); });
  add("kv_append_fp8", [] { kv_append_case<B>(false, 16, 32, true); });
  add("kv_append_fp8_index_keys", [] { kv_append_case<B>(true, 4, 33, true); });
  add("mla_attention_warp_fp8_dense", [] { mla_case<B>(false, 2, 64, 32, {5, 37}, {5, 2}, 0, 34, true); });
  add("mla_attention_warp_fp8_topk", [] { mla_case<B>(true, 2, 64, 48, {9, 40}, {2, 2}, 12, 35, true); });
  add("indexer_scores_warp_fp8", [] { indexer_case<B>(4, 64, {30, 200}, {3, 1}, 36, true); });
  add("indexer_scores_warp_fp8_dim128", [] { indexer_case<B>(2, 128, {150}, {2}, 37, true); });
  if (big) {  // GPU only
    add("big_rms_norm_glm5_hidden", [] { rms_norm_case<B>(false, 64, 6144, 0, 101); });
    add("big_rms_norm_glm5_kv_a", [] { rms_norm_case<B>(true, 33, 512, 64, 102); });
    add("big_layer_norm_glm5_index_key", [] { layer_norm_case<B>(true, 65, 128, 103); });
    add("big_rope_glm5_mla_query", [] { rope_case<B>(true, 17, 64, 256, 192, 64, 1.0f, 104); });
    add("big_embed_rows_glm5", [] { embed_case<B>(false, 40, 6144, 1000, 105); });
    add("big_embed_rows_glm5_b1024_f32_table", [] { embed_case<B>(true, 1024, 6144, 300, 129); });
    add("big_gather_rows_glm5_b1024", [] { gather_case<B>(1024, 6144, 1500, 130); });
    add("big_rope_glm5_mla_query_b1024", [] { rope_case<B>(true, 1024, 64, 256, 192, 64, 1.0f, 131); });
    add("big_silu_mul_past_grid_cap", [] { silu_mul_case<B>(4, 20000, 0, 106); });
    add("big_add_into_past_grid_cap", [] { add_into_case<B>(true, 1100000, 107); });
    add("big_conversions_past_grid_cap", [] { convert_case<B>(1100000, 108); });
    add("big_moe_dense_combine_f32", [] { dense_combine_case<B>(true, 17, 8, 6144, 32, 109); });
    add("big_argmax_rows_f32_glm5_vocab", [] { argmax_case<B>(154880, 110); });
    add("big_argmax_rows_f32_split_glm5_vocab_b64", [] { argmax_case<B>(154880, 122, 64, 1); });
    add("big_argmax_rows_f32_split_glm5_vocab_b11", [] { argmax_case<B>(154880, 123, 11, 1); });
    add("big_argmax_rows_f32_glm5_vocab_b1024", [] { argmax_case<B>(154880, 124, 1024, 1); });
    add("big_rms_norm_f32_in_glm5_hidden_b1024", [] { rms_norm_case<B>(false, 1024, 6144, 0, 125, 3.0f, 0); });
    add("big_rms_norm_f32_in_glm5_hidden_b256_unaligned", [] { rms_norm_case<B>(false, 256, 6144, 1, 126); });
    add("big_rms_norm_bf16_in_q_a_b1024", [] { rms_norm_case<B>(true, 1024, 1536, 0, 127, 3.0f, 0); });
    add("big_rms_norm_bf16_in_past_register_form", [] { rms_norm_case<B>(true, 9, 40000, 0, 128, 3.0f, 0); });
    add("big_token_bitmask_f32_glm5_vocab", [] { token_bitmask_case<B>(154880, 0, 119); });
    add("big_count_experts_glm5", [] { count_experts_case<B>(1024, 8, 256, 111); });
    add("big_count_experts_max_experts", [] { count_experts_case<B>(300, 8, 4096, 112); });
    add("big_greedy_advance_many_requests", [] { greedy_advance_case<B>(true, 300, 8, 113); });
    add("big_mla_attention_warp_bf16_glm5_dense", [] { mla_case<B>(false, 8, 512, 64, {300, 1100, 1}, {1, 20, 1}, 0, 114); });
    add("big_mla_attention_warp_bf16_glm5_topk", [] { mla_case<B>(true, 8, 512, 64, {3000, 700}, {2, 3}, 2048, 115); });
    add("big_mla_attention_warp_bf16_max_dims", [] { mla_case<B>(false, 2, 1024, 128, {200}, {3}, 0, 116); });
    add("big_indexer_scores_warp_bf16_glm5", [] { indexer_case<B>(32, 128, {1500, 40}, {3, 2}, 117); });
    add("big_indexer_scores_warp_bf16_max_q", [] { indexer_case<B>(64, 128, {300}, {2}, 118); });
    add("big_kv_append_fp8_glm5_pages", [] { kv_append_case<B>(true, 64, 119, true); });
    add("big_mla_attention_warp_fp8_glm5_topk", [] { mla_case<B>(true, 8, 512, 64, {3000, 700}, {2, 3}, 2048, 120, true); });
    add("big_indexer_scores_warp_fp8_glm5", [] { indexer_case<B>(32, 128, {1500, 40}, {3, 2}, 121, true); });
  }
  return v;
}

}  // namespace fp4moe::test::ops
