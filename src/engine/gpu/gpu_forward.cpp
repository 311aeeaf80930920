// GpuRunner::Impl::forward: the layer stack of one step on the device (enqueue only; the
// same sequence runs eager or captured in a decode graph). model/model.cpp and
// model/attention.cpp are the reference, op for op.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "cuda/attention/kv_append.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"
#include "engine/gpu/gpu_runner_impl.hpp"

namespace fp4moe::engine::gpu {

DeviceBatch GpuRunner::Impl::batch(int T, int R) const {
  DeviceBatch b;
  b.tokens = T;
  b.requests = R;
  b.qo_indptr = meta.qo_indptr;
  b.positions = meta.positions;
  b.kv_len = meta.kv_len;
  b.page_indptr = meta.page_indptr;
  b.page_indices = meta.page_indices;
  b.token_req = meta.token_req;
  b.page_size = int32_t(opt.page_size);
  return b;
}

namespace {

// Device → host copy of n values (eager only: synchronises the stream).
template <typename V>
std::vector<V> download(const V* src, size_t n, cudaStream_t stream) {
  std::vector<V> v(n);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(v.data(), src, n * sizeof(V), cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return v;
}

}  // namespace

void GpuRunner::Impl::attention(int64_t l, int T, int R, int max_ctx, bool decode, StepChoices* choices) {
  const model::MlaModelConfig& c = cfg;
  const DeviceLayer& L = layers[size_t(l)];
  const int NH = int(c.num_heads), N = int(c.qk_nope_dim), Rd = int(c.qk_rope_dim), QK = N + Rd,
            C = int(c.kv_lora_rank), V = int(c.v_head_dim), W = N + V;
  const LinearCtx x = lctx();
  const DeviceBatch b = batch(T, R);
  const KvBatchView kv_batch{R, T, meta.qo_indptr, meta.positions, meta.kv_len, meta.page_indptr, meta.page_indices};
  const float af = c.rope.attention_factor;
  const bool mla_il = c.mla_rope == model::RopeLayout::Interleaved;
  const bool idx_il = c.index_rope == model::RopeLayout::Interleaved;

  // Queries [T, NH, QK], the rope tail rotated.
  if (c.q_lora_rank > 0) {
    L.q_a.run(s.h, T, s.qa, false, x);
    rms_norm(s.qa, c.q_lora_rank, T, int(c.q_lora_rank), L.q_a_norm.wp(), 1e-6f, s.qa, c.q_lora_rank, stream);
    L.q_b.run(s.qa, T, s.q, false, x);
  } else {
    L.q_proj.run(s.h, T, s.q, false, x);
  }
  rope(s.q, T, NH, int64_t(NH) * QK, QK, N, Rd, meta.positions, inv_freq.as<float>(), af, mla_il, stream);

  // Latent: ckv = RMSNorm(kv[:, :C]); kpe = RoPE(kv[:, C:]) in place (or both straight into the
  // cache, in one launch).
  const KvLayerView& kvl = kv_layers[size_t(l)];
  L.kv_a.run(s.h, T, s.kva, false, x);
  if (fast_latent) {
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
    mark(StepStage::Indexer);
    L.wk.run(s.h, T, s.ik, false, x);
    if (fast_index_key) {  // LayerNorm + RoPE + the write into the cache, one launch
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
    mark(StepStage::Attention);
  }
  if (!fast_latent && kv_fp8)  // (fast_latent: every key of the layer is already in the cache)
    kv_append_fp8(kvl, b, s.ckv, C, s.kva + C, C + Rd, L.has_indexer && !fast_index_key ? s.ik : nullptr, stream);
  else if (!fast_latent)
    kv_append_bf16(kvl, b, s.ckv, C, s.kva + C, C + Rd, L.has_indexer && !fast_index_key ? s.ik : nullptr, stream);

  // Top-k: this layer's indexer, or the previous full layer's (still in s.topk_slot).
  const int32_t* topk = nullptr;
  if (L.has_indexer) {
    mark(StepStage::Indexer);
    L.wq_b.run(s.qa, T, s.iq, false, x);
    // The mma scores rotate interleaved query pairs and read the BF16 head weights themselves
    // (BF16 keys only: the FP8 scores take queries quantized after their RoPE, FP32 weights).
    const bool q8 = fast_indexer && kv_fp8;
    const bool fused_q = fast_indexer && idx_il && !q8;
    if (!fused_q)
      rope(s.iq, T, HI, int64_t(HI) * D, D, 0, Rd, meta.positions, inv_freq.as<float>(), af, idx_il, stream);
    L.weights_proj.run(s.h, T, s.iw16, false, x);
    const float w_scale = 1.0f / std::sqrt(float(HI));
    if (!fast_indexer || q8) bf16_to_f32_scaled(s.iw16, s.iw, int64_t(T) * HI, w_scale, stream);
    if (q8) cuda::indexer::quantize_q_fp8(s.iq, s.iw, s.iq8, s.iw8, T, stream);  // per (token, head) scale into w
    // The score rows [T, max_ctx] in chunks of at most score_rows rows (the memory plan's: the
    // score buffer is [score_rows, max_context]); one chunk (the whole batch, as it is) unless a
    // long prefill step exceeds it. A chunk is the batch's rows [r0, r0 + n) as a batch of its own
    // (chunk_qo_indptr, positions + r0): the same scores and selection per row.
    const int rows_per_chunk = int(std::min<int64_t>(T, score_rows));
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
      ta.sample_lines = kTopKSampleLines;
      ta.one_cta_keys = n >= kTopKOneCtaMinRows && n <= topk_one_cta_max_rows ? topk_one_cta_keys_many_rows : 0;
      cuda::indexer::top_k(ta, stream);
    }
    topk = s.topk_slot;
    mark(StepStage::Attention);
    if (choices) choices->topk_positions[size_t(l)] = download(s.topk_pos, size_t(T) * c.index_topk, stream);
  } else if (c.indexer[size_t(l)] == model::IndexerKind::Shared) {
    topk = s.topk_slot;
  }

  // Absorbed MLA: q_lat[t,h] = W_UK[h]ᵀ q_nope[t,h]; attention over the latent cache;
  // v[t,h] = W_UV[h] · out_lat[t,h] (kv_b rows: per head N nope rows then V value rows).
  const uint16_t* wkv = L.kv_b.bf16();
  blas.batched(false, C, T, N, wkv, C, int64_t(W) * C, s.q, int64_t(NH) * QK, QK, s.ql, false, int64_t(NH) * C, C, NH,
               stream);
  mla(l, T, R, max_ctx, decode, topk);
  blas.batched(true, V, T, C, wkv + int64_t(N) * C, C, int64_t(W) * C, s.ol, int64_t(NH) * C, C, s.ov, false,
               int64_t(NH) * V, V, NH, stream);
  L.o.run(s.ov, T, s.o, false, x);
}

void GpuRunner::Impl::mla(int64_t l, int T, int R, int max_ctx, bool decode, const int32_t* topk) {
  const model::MlaModelConfig& c = cfg;
  const int NH = int(c.num_heads), N = int(c.qk_nope_dim), Rd = int(c.qk_rope_dim), QK = N + Rd;
  const KvLayerView& kvl = kv_layers[size_t(l)];
  const bool prefill = !topk && !decode && prefill_planned;
  if (!mla_fast || (!topk && !decode && !prefill)) {
    (kv_fp8 ? mla_attention_warp_fp8 : mla_attention_warp_bf16)(s.ql, s.q + N, int64_t(NH) * QK, QK, kvl, batch(T, R),
                                                                NH, c.softmax_scale, topk, int(c.index_topk), s.ol,
                                                                stream);
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
    mla_prefill->run(a, stream);
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
    rows.page_size = opt.page_size;
    rows.max_keys = max_ctx;
  }
  if (mla_fi_decode && !(topk && T <= mma_sparse_max_rows)) {
    mla_fi_decode->run_device(a, rows, stream);
  } else {
    mla_fast->run_device(a, rows, stream);
  }
}

// MlaSm90 takes the step when: it exists (sm_90, FlashInfer, heads a power of two <= 128), the
// model has a dense-attention layer, the step is not a decode step, its host batch is known
// (eager step()), every request has >= 1 new token at the end of its context (the kernel's
// causal rule), and the schedule fits (FlashInfer's bound on work items, as MlaSm90::plan_impl).
void GpuRunner::Impl::plan_prefill(int T, bool decode) {
  prefill_planned = false;
  if (!mla_prefill || decode || !host_batch || host_batch->num_tokens != T) return;
  const KvBatchView& b = *host_batch;
  const int64_t H = cfg.num_heads;
  if (T * H / 64 + b.num_requests + 1024 > cuda::attention::MlaSm90::kMaxWorks) return;
  for (int64_t r = 0; r < b.num_requests; ++r) {
    const int32_t q = b.qo_indptr[r + 1] - b.qo_indptr[r];
    if (q < 1) return;
    for (int32_t j = 0; j < q; ++j)
      if (b.positions[b.qo_indptr[r] + j] != b.kv_len[r] - q + j) return;
  }
  mla_prefill->plan(b, opt.page_size, kv_layers.empty() ? num_pages : kv_layers[0].num_pages, stream);
  prefill_planned = true;
}

void GpuRunner::Impl::dense_mlp(const DenseMlp& m, int T, uint16_t* out) {
  const LinearCtx x = lctx();
  m.gate.run(s.h, T, s.g, false, x);
  m.up.run(s.h, T, s.u, false, x);
  silu_mul(s.g, m.inter, s.u, m.inter, s.hm, T, int(m.inter), stream);
  m.down.run(s.hm, T, out, false, x);
}

void GpuRunner::Impl::mlp(int64_t l, int T, StepChoices* choices) {
  const DeviceLayer& L = layers[size_t(l)];
  const int64_t H = cfg.hidden;
  if (!L.is_moe) {
    dense_mlp(L.mlp, T, s.o);
    add_into(s.x, s.o, int64_t(T) * H, stream);
    return;
  }
  if (L.moe) {
    const MoeWorkspace ws{s.moe_ws, s.moe_ws_bytes};
    L.moe->forward(s.h, T, s.of, ws, stream);
    const MoeRoutingView v = L.moe->routing(ws, T);
    const MoeConfig& mc = L.moe->config();
    count_layer(l, v.topk_ids, T, int(mc.top_k));
    if (choices) {
      choices->router_logits[size_t(l)] = download(v.logits, size_t(T * mc.num_experts), stream);
      choices->expert_ids[size_t(l)] = download(v.topk_ids, size_t(T * mc.top_k), stream);
    }
  } else {
    const DenseExperts& d = *L.dense_experts;
    const int E = d.router.num_experts, k = d.router.top_k, I = int(cfg.moe.inter);
    cuda::route(d.router, s.h, d.router_w.as<float>(), d.router_bias.as<float>(), T, int(H), s.rlogits, s.rids, s.rw,
                cuda::RouterWorkspace{s.router_ws, s.router_ws_bytes}, stream);
    // gu[e] (2I × T col-major) = W13_e · x; h = SiLU(gate) · up; y[e] (H × T) = W2_e · h_e.
    blas.batched(true, 2 * I, T, int(H), d.w13.ptr(), H, int64_t(2) * I * H, s.h, H, 0, s.gu, false, 2 * I,
                 int64_t(T) * 2 * I, E, stream);
    silu_mul(s.gu, 2 * I, s.gu + I, 2 * I, s.eh, E * T, I, stream);
    blas.batched(true, int(H), T, I, d.w2.ptr(), I, H * I, s.eh, I, int64_t(T) * I, s.ey, true, H, int64_t(T) * H, E,
                 stream);
    moe_dense_combine_f32(s.ey, s.rids, s.rw, nullptr, T, k, int(H), s.of, stream);
    count_layer(l, s.rids, T, k);
    if (choices) {
      choices->router_logits[size_t(l)] = download(s.rlogits, size_t(T) * E, stream);
      choices->expert_ids[size_t(l)] = download(s.rids, size_t(T) * k, stream);
    }
  }
  add_into(s.x, s.of, int64_t(T) * H, stream);
  if (L.shared) {
    dense_mlp(*L.shared, T, s.o);
    add_into(s.x, s.o, int64_t(T) * H, stream);
  }
}

void GpuRunner::Impl::forward(int T, int R, int rows, int max_ctx, bool decode, model::HiddenStates* hidden,
                              StepChoices* choices) {
  const model::MlaModelConfig& c = cfg;
  const int H = int(c.hidden);
  const float eps = float(c.rms_norm_eps);
  auto keep = [&](const float* src) {
    std::vector<float> v(size_t(T) * H);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(v.data(), src, v.size() * 4, cudaMemcpyDeviceToHost, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    hidden->push_back(std::move(v));
  };
  plan_prefill(T, decode);
  mark(StepStage::Embed);
  embed_rows(embed.ptr(), false, meta.tokens, T, H, s.x, stream);
  if (hidden) {
    hidden->clear();
    keep(s.x);
  }
  if (choices) {
    *choices = StepChoices{};
    choices->router_logits.resize(size_t(c.num_layers));
    choices->expert_ids.resize(size_t(c.num_layers));
    choices->topk_positions.resize(size_t(c.num_layers));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& L = layers[size_t(l)];
    mark(StepStage::Attention);
    rms_norm(s.x, H, T, H, L.input_norm.wp(), eps, s.h, H, stream);
    attention(l, T, R, max_ctx, decode, choices);
    add_into(s.x, s.o, int64_t(T) * H, stream);
    rms_norm(s.x, H, T, H, L.post_norm.wp(), eps, s.h, H, stream);
    mark(L.is_moe ? StepStage::Moe : StepStage::Dense);
    mlp(l, T, choices);
    if (hidden && l + 1 < c.num_layers) keep(s.x);
  }
  mark(StepStage::LmHead);
  rms_norm(s.x, H, T, H, final_norm.wp(), eps, s.h, H, stream);
  if (hidden) {
    std::vector<uint16_t> hb(size_t(T) * H);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(hb.data(), s.h, hb.size() * 2, cudaMemcpyDeviceToHost, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> v(hb.size());
    for (size_t i = 0; i < hb.size(); ++i) {
      const uint32_t u = uint32_t(hb[i]) << 16;
      std::memcpy(&v[i], &u, 4);
    }
    hidden->push_back(std::move(v));
  }
  if (rows > 0) {
    gather_rows(s.h, H, meta.rows, rows, s.rows, stream);
    lm_head.run(s.rows, rows, s.logits, true, lctx());
    mark(StepStage::Sampling);
    apply_token_masks(rows);  // grammar masks (rows whose slot is -1 are left alone)
    argmax_rows_f32(s.logits, rows, int(c.vocab), s.greedy, stream);
  }
  mark(StepStage::Sampling);  // the end of the last stage
}

void GpuRunner::Impl::count_layer(int64_t l, const int32_t* ids, int T, int k) {
  const StepCounters& c = counters;
  if (!opt.count_experts || c.moe_layers == 0) return;
  count_experts(ids, T, k, meta.token_req, meta.active, int(c.experts),
                c.counts.as<int32_t>() + int64_t(c.moe_slot[size_t(l)]) * c.experts, stream);
}

void GpuRunner::Impl::mark(StepStage st) {
  if (!marks) return;
  StageMarks& m = *marks;
  if (m.used == m.events.size()) {
    cudaEvent_t e = nullptr;
    FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
    m.events.push_back(e);
    m.stage.push_back(st);
  }
  m.stage[m.used] = st;
  FP4MOE_CUDA_CHECK(cudaEventRecord(m.events[m.used], stream));
  ++m.used;
}

}  // namespace fp4moe::engine::gpu
