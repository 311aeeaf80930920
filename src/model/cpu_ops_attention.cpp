// CpuOps::run(AttentionArgs): MLA with the DSA indexer and the cache write for one layer over
// a step's batch (model/ops.hpp AttentionArgs).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/attention/indexer_cpu.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cpu/attention/mla_cpu.hpp"
#include "cpu/attention/mla_expanded_cpu.hpp"
#include "cpu/linear_cpu.hpp"
#include "model/cpu_ops.hpp"

namespace fp4moe::model {
namespace {

// A batch made of a subset of another batch's requests, with its own arrays.
struct SubBatch {
  std::vector<int32_t> requests;  // indices into the parent batch
  std::vector<int32_t> tokens;    // parent flat token of each sub-batch token
  std::vector<int32_t> qo, pos, kv_len, page_ptr, pages;
  KvBatchView view() const {
    return {int64_t(kv_len.size()), int64_t(pos.size()), qo.data(), pos.data(), kv_len.data(), page_ptr.data(),
            pages.data()};
  }
};

SubBatch sub_batch(const KvBatchView& b, const std::vector<int32_t>& requests) {
  SubBatch s;
  s.requests = requests;
  s.qo = {0};
  s.page_ptr = {0};
  for (int32_t r : requests) {
    for (int32_t t = b.qo_indptr[r]; t < b.qo_indptr[r + 1]; ++t) {
      s.tokens.push_back(t);
      s.pos.push_back(b.positions[t]);
    }
    s.qo.push_back(int32_t(s.pos.size()));
    s.kv_len.push_back(b.kv_len[r]);
    for (int32_t p = b.page_indptr[r]; p < b.page_indptr[r + 1]; ++p) s.pages.push_back(b.page_indices[p]);
    s.page_ptr.push_back(int32_t(s.pages.size()));
  }
  return s;
}

// Rotates the first `rope` dims of each of `heads` vectors of `stride` floats in every token.
void rope_rows(float* x, int64_t T, int64_t heads, int64_t stride, int64_t offset, int64_t rope, const float* cos,
               const float* sin, RopeLayout layout) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h)
      apply_rope(x + (t * heads + h) * stride + offset, rope, cos + t * (rope / 2), sin + t * (rope / 2), layout);
}

}  // namespace

void CpuOps::run(const AttentionArgs& args) {
  const MlaModelConfig& c = cfg_;
  const KvBatchView& b = batch_;
  HostKvPool& kv = kv_;
  CpuStepState& s = s_;
  const int64_t l = args.ref.layer;
  const IndexerKind kind = args.indexer;
  const AttentionWeights& a = layer_weights(args.ref).attn;
  const float* h = args.h.ptr<const float>();
  float* out = args.out.ptr<float>();
  const int64_t T = b.num_tokens, NH = c.num_heads, N = c.qk_nope_dim, R = c.qk_rope_dim, QK = N + R,
                C = c.kv_lora_rank, V = c.v_head_dim, W = N + V;
  const int th = threads();
  Arena::Scope scope(arena_);

  // Queries: q [T, NH, nope + rope], the rope part rotated in place.
  float* q = arena_.alloc<float>(size_t(T * NH * QK));
  float* qa = nullptr;
  if (c.q_lora_rank > 0) {
    qa = arena_.alloc<float>(size_t(T * c.q_lora_rank));
    cpu::linear_cpu(a.q_a.w, h, T, qa, th);
    rms_norm_rows(qa, T, c.q_lora_rank, c.q_lora_rank, a.q_a_norm.weight.data(), 1e-6f, qa, c.q_lora_rank);
    cpu::linear_cpu(a.q_b.w, qa, T, q, th);
  } else {
    cpu::linear_cpu(a.q_proj.w, h, T, q, th);
  }
  rope_rows(q, T, NH, QK, N, R, s.cos, s.sin, c.mla_rope);

  // Latent: ckv = kv_a_layernorm(kv[:, :C]), kpe = RoPE(kv[:, C:]).
  float* kva = arena_.alloc<float>(size_t(T * (C + R)));
  cpu::linear_cpu(a.kv_a.w, h, T, kva, th);
  float* ckv = arena_.alloc<float>(size_t(T * C));
  float* kpe = arena_.alloc<float>(size_t(T * R + 1));
  rms_norm_rows(kva, T, C, C + R, a.kv_a_norm.weight.data(), 1e-6f, ckv, C);
  for (int64_t t = 0; t < T; ++t) std::memcpy(kpe + t * R, kva + t * (C + R) + C, size_t(R) * sizeof(float));
  rope_rows(kpe, T, 1, R, 0, R, s.cos, s.sin, c.mla_rope);

  // Indexer keys (full layers), then the append of this step's keys.
  const KvLayerView& layer = kv.layer(l);
  float* ik = nullptr;
  const int64_t D = c.index_head_dim, HI = c.index_n_heads;
  if (a.indexer) {
    FP4MOE_CHECK(layer.index_k && layer.index_dim == D, "KV pool: layer {} has no index-key array of dim {}", l, D);
    ik = arena_.alloc<float>(size_t(T * D));
    cpu::linear_cpu(a.indexer->wk.w, h, T, ik, th);
    layer_norm_rows(ik, T, D, a.indexer->k_norm.weight.data(), a.indexer->k_norm.bias.data(), 1e-6f, ik);
    rope_rows(ik, T, 1, D, 0, R, s.cos, s.sin, c.index_rope);
  }
  cpu::kv_append_cpu(layer, b, ckv, kpe, ik);

  // Top-k selection: this layer's indexer, the previous full layer's ("shared"), or none.
  const int32_t* topk = nullptr;
  if (a.indexer) {
    float* iq = arena_.alloc<float>(size_t(T * HI * D));
    cpu::linear_cpu(a.indexer->wq_b.w, qa, T, iq, th);
    rope_rows(iq, T, HI, D, 0, R, s.cos, s.sin, c.index_rope);
    float* wts = arena_.alloc<float>(size_t(T * HI));
    cpu::linear_cpu(a.indexer->weights_proj.w, h, T, wts, th);
    const float ws = 1.0f / std::sqrt(float(HI));
    for (int64_t i = 0; i < T * HI; ++i) wts[i] *= ws;
    int64_t stride = 1;
    for (int64_t t = 0; t < T; ++t) stride = std::max<int64_t>(stride, b.positions[t] + 1);
    float* scores = arena_.alloc<float>(size_t(T * stride));
    cpu::IndexerParams ip;
    ip.n_heads = HI;
    ip.softmax_scale = 1.0f / std::sqrt(float(D));
    ip.threads = th;
    cpu::indexer_scores_cpu(layer, b, iq, wts, ip, scores, stride);
    cpu::indexer_topk_cpu(b, scores, stride, s.topk_k, s.topk, th);
    if (opt_.hooks.topk_positions)
      if (const int32_t* forced = opt_.hooks.topk_positions(l, T, s.topk_k))
        std::copy(forced, forced + T * s.topk_k, s.topk);
    s.have_topk = true;
    topk = s.topk;
  } else if (kind == IndexerKind::Shared) {
    FP4MOE_CHECK(s.have_topk, "layer {} shares the top-k of an earlier layer, but none computed one", l);
    topk = s.topk;
  }

  // Attention per request: expanded (prefill) or absorbed (decode).
  std::vector<int32_t> expanded, absorbed;
  for (int32_t r = 0; r < int32_t(b.num_requests); ++r) {
    const int64_t n = b.qo_indptr[r + 1] - b.qo_indptr[r];
    if (n == 0) continue;
    const AttentionForm form = form_;
    const bool exp = form == AttentionForm::Expanded || (form == AttentionForm::Auto && n > 1);
    (exp ? expanded : absorbed).push_back(r);
  }
  float* ov = arena_.alloc<float>(size_t(T * NH * V));  // [T, NH, v]
  for (const auto* group : {&expanded, &absorbed}) {
    if (group->empty()) continue;
    const SubBatch sb = sub_batch(b, *group);
    const int64_t Ts = int64_t(sb.tokens.size());
    Arena::Scope inner(arena_);
    float* qn = arena_.alloc<float>(size_t(Ts * NH * N));
    float* qr = arena_.alloc<float>(size_t(Ts * NH * R + 1));
    int32_t* tk = topk ? arena_.alloc<int32_t>(size_t(Ts * s.topk_k)) : nullptr;
    for (int64_t i = 0; i < Ts; ++i) {
      const int64_t t = sb.tokens[size_t(i)];
      for (int64_t hh = 0; hh < NH; ++hh) {
        std::memcpy(qn + (i * NH + hh) * N, q + (t * NH + hh) * QK, size_t(N) * sizeof(float));
        std::memcpy(qr + (i * NH + hh) * R, q + (t * NH + hh) * QK + N, size_t(R) * sizeof(float));
      }
      if (tk) std::memcpy(tk + i * s.topk_k, topk + t * s.topk_k, size_t(s.topk_k) * sizeof(int32_t));
    }
    float* os = arena_.alloc<float>(size_t(Ts * NH * V));
    if (group == &expanded) {
      cpu::MlaExpandedParams p;
      p.num_heads = NH;
      p.nope_dim = N;
      p.v_dim = V;
      p.sm_scale = c.softmax_scale;
      p.topk = tk;
      p.topk_k = s.topk_k;
      p.threads = th;
      cpu::mla_attention_expanded_cpu(layer, sb.view(), a.kv_b.w, qn, qr, p, os);
    } else {
      // Absorbed: q_latent[t,h] = W_UK[h]ᵀ q_nope[t,h]; out_latent → v[t,h] = W_UV[h] · out_latent.
      float* ql = arena_.alloc<float>(size_t(Ts * NH * C));
      float* ol = arena_.alloc<float>(size_t(Ts * NH * C));
      std::fill(ql, ql + Ts * NH * C, 0.0f);
      // Per head: every W_UK / W_UV row decoded once for all the sub-batch's tokens.
      parallel_for(NH, th, grain_for(Ts * N * C), [&](int64_t h0, int64_t h1) {
        for (int64_t hh = h0; hh < h1; ++hh)
          cpu::linear_t_accumulate_cpu(a.kv_b.w.rows(hh * W, hh * W + N), qn + hh * N, NH * N, Ts, ql + hh * C, NH * C);
      });
      cpu::MlaAttentionParams p;
      p.num_heads = NH;
      p.sm_scale = c.softmax_scale;
      p.topk = tk;
      p.topk_k = s.topk_k;
      p.threads = th;
      cpu::mla_attention_cpu(layer, sb.view(), ql, qr, p, ol, nullptr);
      parallel_for(NH, th, grain_for(Ts * V * C), [&](int64_t h0, int64_t h1) {
        for (int64_t hh = h0; hh < h1; ++hh)
          cpu::linear_strided_cpu(a.kv_b.w.rows(hh * W + N, (hh + 1) * W), ol + hh * C, NH * C, Ts, os + hh * V, NH * V, 1);
      });
    }
    for (int64_t i = 0; i < Ts; ++i)
      std::memcpy(ov + int64_t(sb.tokens[size_t(i)]) * NH * V, os + i * NH * V, size_t(NH * V) * sizeof(float));
  }
  cpu::linear_cpu(a.o.w, ov, T, out, th);
}

}  // namespace fp4moe::model
