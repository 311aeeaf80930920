// CudaOps::run(AttentionArgs): one layer's MLA with the DSA indexer and the cache write on the
// device (enqueue only), and mla(): which attention kernel takes the layer's rows.
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "cuda/attention/kv_append.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"
#include "backend/cuda/cuda_ops.hpp"

namespace fp4moe::engine::gpu {

void CudaOps::run(const model::AttentionArgs& args) {
  GpuRunner::Impl& m = m_;
  Scratch& s = m.s;
  const cudaStream_t stream = m.stream;
  const RunnerOptions& opt = m.opt;
  const StepMeta& meta = m.meta;
  const cuda::DeviceBuffer& inv_freq = m.inv_freq;
  const bool kv_fp8 = m.kv_fp8, fast_indexer = m.fast_indexer;
  const int64_t l = args.ref.layer;
  const int T = T_, R = R_, max_ctx = max_ctx_;
  const uint16_t* h = bf16_bits(args.h);
  const model::MlaModelConfig& c = m.cfg;
  const DeviceLayer& L = m.layer(args.ref);
  const int NH = int(c.num_heads), N = int(c.qk_nope_dim), Rd = int(c.qk_rope_dim), QK = N + Rd,
            C = int(c.kv_lora_rank), V = int(c.v_head_dim), W = N + V;
  const LinearCtx x = m.lctx();
  const DeviceBatch b = m.batch(T, R);
  const KvBatchView kv_batch{R, T, meta.qo_indptr, meta.positions, meta.kv_len, meta.page_indptr, meta.page_indices};
  const float af = c.rope.attention_factor;
  const bool mla_il = c.mla_rope == model::RopeLayout::Interleaved;
  const bool idx_il = c.index_rope == model::RopeLayout::Interleaved;

  // Queries [T, NH, QK], the rope tail rotated.
  if (c.q_lora_rank > 0) {
    L.q_a.run(h, T, s.qa, false, x);
    rms_norm(s.qa, c.q_lora_rank, T, int(c.q_lora_rank), L.q_a_norm.wp(), 1e-6f, s.qa, c.q_lora_rank, stream);
    L.q_b.run(s.qa, T, s.q, false, x);
  } else {
    L.q_proj.run(h, T, s.q, false, x);
  }
  rope(s.q, T, NH, int64_t(NH) * QK, QK, N, Rd, meta.positions, inv_freq.as<float>(), af, mla_il, stream);

  // Latent: ckv = RMSNorm(kv[:, :C]); kpe = RoPE(kv[:, C:]) in place (or both straight into the
  // cache, in one launch).
  const KvLayerView& kvl = m.kv_layer(args.ref);
  L.kv_a.run(h, T, s.kva, false, x);
  if (m.fast_latent) {
    cuda::attention::KvLatentPrepArgs la;
    la.kv = s.kva;
    la.kv_stride = C + Rd;
    la.norm_w = L.kv_a_norm.wp();
    la.interleaved = mla_il;
    la.inv_freq = inv_freq.as<float>();
    la.attn_factor = af;
    la.layer = kvl;
    la.batch = kv_batch;
    cuda::attention::kv_latent_prep(la, stream);
  } else {
    rms_norm(s.kva, C + Rd, T, C, L.kv_a_norm.wp(), 1e-6f, s.ckv, C, stream);
    rope(s.kva, T, 1, C + Rd, 0, C, Rd, meta.positions, inv_freq.as<float>(), af, mla_il, stream);
  }

  const int D = int(c.index_head_dim), HI = int(c.index_n_heads);
  if (L.has_indexer) {
    m.mark(StepStage::Indexer);
    L.wk.run(h, T, s.ik, false, x);
    if (m.fast_index_key) {  // LayerNorm + RoPE + the write into the cache, one launch
      cuda::indexer::IndexKeyPrepArgs ka;
      ka.k = s.ik;
      ka.k_stride = D;
      ka.ln_w = L.k_norm.wp();
      ka.ln_b = L.k_norm.bp();
      ka.rope_dim = Rd;
      ka.interleaved = idx_il;
      ka.inv_freq = inv_freq.as<float>();
      ka.attn_factor = af;
      ka.layer = kvl;
      ka.batch = kv_batch;
      cuda::indexer::index_key_prep(ka, stream);
    } else {
      layer_norm(s.ik, T, D, L.k_norm.wp(), L.k_norm.bp(), 1e-6f, s.ik, stream);
      rope(s.ik, T, 1, D, 0, 0, Rd, meta.positions, inv_freq.as<float>(), af, idx_il, stream);
    }
    m.mark(StepStage::Attention);
  }
  if (!m.fast_latent && kv_fp8)  // (fast_latent: every key of the layer is already in the cache)
    kv_append_fp8(kvl, b, s.ckv, C, s.kva + C, C + Rd, L.has_indexer && !m.fast_index_key ? s.ik : nullptr, stream);
  else if (!m.fast_latent)
    kv_append_bf16(kvl, b, s.ckv, C, s.kva + C, C + Rd, L.has_indexer && !m.fast_index_key ? s.ik : nullptr, stream);

  // Top-k: this layer's indexer, or the previous full layer's (still in s.topk_slot).
  const int32_t* topk = nullptr;
  if (L.has_indexer) {
    m.mark(StepStage::Indexer);
    L.wq_b.run(s.qa, T, s.iq, false, x);
    // The mma scores rotate interleaved query pairs and read the BF16 head weights themselves
    // (BF16 keys only: the FP8 scores take queries quantized after their RoPE, FP32 weights).
    const bool q8 = fast_indexer && kv_fp8;
    const bool fused_q = fast_indexer && idx_il && !q8;
    if (!fused_q)
      rope(s.iq, T, HI, int64_t(HI) * D, D, 0, Rd, meta.positions, inv_freq.as<float>(), af, idx_il, stream);
    L.weights_proj.run(h, T, s.iw16, false, x);
    const float w_scale = 1.0f / std::sqrt(float(HI));
    if (!fast_indexer || q8) bf16_to_f32_scaled(s.iw16, s.iw, int64_t(T) * HI, w_scale, stream);
    if (q8) cuda::indexer::quantize_q_fp8(s.iq, s.iw, s.iq8, s.iw8, T, stream);  // per (token, head) scale into w
    // The score rows [T, max_ctx] in chunks of at most score_rows rows (the memory plan's: the
    // score buffer is [score_rows, max_context]); one chunk (the whole batch, as it is) unless a
    // long prefill step exceeds it. A chunk is the batch's rows [r0, r0 + n) as a batch of its own
    // (chunk_qo_indptr, positions + r0): the same scores and selection per row.
    const int rows_per_chunk = int(std::min<int64_t>(T, m.score_rows));
    for (int r0 = 0; r0 < T; r0 += rows_per_chunk) {
      const int n = std::min(rows_per_chunk, T - r0);
      KvBatchView cb = kv_batch;
      DeviceBatch db = b;
      if (n < T) {
        chunk_qo_indptr(meta.qo_indptr, R, r0, n, s.chunk_qo, stream);
        cb.num_tokens = n, cb.qo_indptr = s.chunk_qo, cb.positions = meta.positions + r0;
        db.tokens = n, db.qo_indptr = s.chunk_qo, db.positions = meta.positions + r0, db.token_req = meta.token_req + r0;
      }
      if (fast_indexer) {  // cuda/indexer's mma scores (32 heads x 128; device metadata only)
        cuda::indexer::IndexerScoreArgs ia;
        if (q8) {
          ia.q = s.iq8 + size_t(r0) * HI * D;
          ia.w = s.iw8 + size_t(r0) * HI;
        } else {
          ia.q = s.iq + size_t(r0) * HI * D;
          ia.w_bf16 = s.iw16 + size_t(r0) * HI;
          ia.w_bf16_scale = w_scale;
        }
        if (fused_q) {
          ia.q_rope_inv_freq = inv_freq.as<float>();
          ia.q_rope_dim = Rd;
          ia.q_rope_attn_factor = af;
        }
        ia.layer = kvl;
        ia.batch = cb;
        ia.max_ctx = max_ctx;
        ia.scores = s.scores;
        ia.score_stride = opt.max_context;
        cuda::indexer::index_scores(ia, stream);
      } else {
        (kv_fp8 ? indexer_scores_warp_fp8 : indexer_scores_warp_bf16)(
            s.iq + size_t(r0) * HI * D, s.iw + size_t(r0) * HI, kvl, db, HI, D, 1.0f / std::sqrt(float(D)), max_ctx,
            s.scores, opt.max_context, stream);
      }
      cuda::indexer::TopKArgs ta;
      ta.scores = s.scores;
      ta.score_stride = opt.max_context;
      ta.max_ctx = max_ctx;
      ta.batch = cb;
      ta.top_k = int(c.index_topk);
      ta.out_pos = s.topk_pos + size_t(r0) * c.index_topk;
      ta.out_slot = s.topk_slot + size_t(r0) * c.index_topk;
      ta.page_size = opt.page_size;
      ta.workspace = s.topk_ws;
      ta.workspace_bytes = s.topk_ws_bytes;
      ta.sample_lines = GpuRunner::Impl::kTopKSampleLines;
      ta.one_cta_keys = n >= GpuRunner::Impl::kTopKOneCtaMinRows && n <= m.topk_one_cta_max_rows
                            ? m.topk_one_cta_keys_many_rows
                            : 0;
      cuda::indexer::top_k(ta, stream);
    }
    topk = s.topk_slot;
    m.mark(StepStage::Attention);
    if (choices_ && !args.ref.mtp)
      choices_->topk_positions[size_t(l)] = download(s.topk_pos, size_t(T) * c.index_topk, stream);
  } else if (args.indexer == model::IndexerKind::Shared) {
    topk = s.topk_slot;
  }

  // Absorbed MLA: q_lat[t,h] = W_UK[h]ᵀ q_nope[t,h]; attention over the latent cache;
  // v[t,h] = W_UV[h] · out_lat[t,h] (kv_b rows: per head N nope rows then V value rows).
  const uint16_t* wkv = L.kv_b.bf16();
  m.blas.batched(false, C, T, N, wkv, C, int64_t(W) * C, s.q, int64_t(NH) * QK, QK, s.ql, false, int64_t(NH) * C, C,
                 NH, stream);
  mla(kvl, topk);
  m.blas.batched(true, V, T, C, wkv + int64_t(N) * C, C, int64_t(W) * C, s.ol, int64_t(NH) * C, C, s.ov, false,
                 int64_t(NH) * V, V, NH, stream);
  L.o.run(s.ov, T, bf16_bits(args.out), false, x);
}

void CudaOps::mla(const KvLayerView& kvl, const int32_t* topk) {
  GpuRunner::Impl& m = m_;
  Scratch& s = m.s;
  const cudaStream_t stream = m.stream;
  const StepMeta& meta = m.meta;
  const int T = T_, R = R_, max_ctx = max_ctx_;
  const bool decode = decode_;
  const model::MlaModelConfig& c = m.cfg;
  const int NH = int(c.num_heads), N = int(c.qk_nope_dim), Rd = int(c.qk_rope_dim), QK = N + Rd;
  const bool prefill = !topk && !decode && m.prefill_planned;
  if (!m.mla_fast || (!topk && !decode && !prefill)) {
    (m.kv_fp8 ? mla_attention_warp_fp8 : mla_attention_warp_bf16)(s.ql, s.q + N, int64_t(NH) * QK, QK, kvl,
                                                                  m.batch(T, R), NH, c.softmax_scale, topk,
                                                                  int(c.index_topk), s.ol, stream);
    return;
  }
  // MlaDecodeMma takes a contiguous [T, NH, 64] rope query: one strided copy (a graph node).
  FP4MOE_CUDA_CHECK(cudaMemcpy2DAsync(s.qpe, size_t(Rd) * 2, s.q + N, size_t(QK) * 2, size_t(Rd) * 2,
                                      size_t(T) * NH, cudaMemcpyDeviceToDevice, stream));
  cuda::attention::MlaRunArgs a;
  a.q_nope = s.ql;
  a.q_pe = s.qpe;
  a.layer = kvl;
  a.kv_indices = topk ? topk : meta.page_indices;
  a.out = s.ol;
  if (prefill) {  // FlashInfer's causal chunked MLA, planned for this step in plan_prefill
    m.mla_prefill->run(a, stream);
    return;
  }
  cuda::attention::MlaDeviceRows rows;
  rows.tokens = T;
  if (topk) {  // DSA: every token (prefill or decode) over its first min(top_k, position + 1) slots
    rows.positions = meta.positions;
    rows.top_k = int(c.index_topk);
    rows.max_keys = std::min(max_ctx, rows.top_k);
  } else {  // dense decode: token t = request t, keys [0, kv_len[t]) through its page table
    rows.kv_len = meta.kv_len;
    rows.page_indptr = meta.page_indptr;
    rows.page_size = m.opt.page_size;
    rows.max_keys = max_ctx;
  }
  if (m.mla_fi_decode && !(topk && T <= m.mma_sparse_max_rows)) {
    m.mla_fi_decode->run_device(a, rows, stream);
  } else {
    m.mla_fast->run_device(a, rows, stream);
  }
}

}  // namespace fp4moe::engine::gpu
