// MLA attention (absorbed form) over the paged cache: per (token, block of heads) work item,
// keys decoded in blocks of kKeyBlock rows once for all heads of the item, online softmax.
#include "cpu/attention/mla_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cpu/vec_avx2.hpp"

namespace fp4moe::cpu {
namespace {

constexpr int64_t kKeyBlock = 32;
constexpr int64_t kHeadBlock = 16;

// Checks every sparse row: entries -1 or in [0, p], no duplicates.
void validate_topk(const KvBatchView& b, const int32_t* topk, int64_t k, int threads) {
  std::vector<int32_t> req(size_t(b.num_tokens));
  kv_token_requests(b, req.data());
  parallel_for(b.num_tokens, threads, 16, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> row;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = b.positions[t];
      row.clear();
      for (int64_t i = 0; i < k; ++i) {
        const int32_t j = topk[t * k + i];
        if (j == -1) continue;
        FP4MOE_CHECK(j >= 0 && j <= p, "mla_attention_cpu: token {} (position {}) selects key position {}", t, p, j);
        row.push_back(j);
      }
      std::sort(row.begin(), row.end());
      FP4MOE_CHECK(std::adjacent_find(row.begin(), row.end()) == row.end(),
                   "mla_attention_cpu: token {} selects a key position twice", t);
    }
  });
}

}  // namespace

void mla_attention_cpu(const KvLayerView& L, const KvBatchView& b, const float* q_latent, const float* q_rope,
                       const MlaAttentionParams& prm, float* out, float* lse) {
  validate_kv_batch(b, L.page_size, L.num_pages);
  const int64_t H = prm.num_heads, C = L.ckv_dim, R = L.kpe_dim, T = b.num_tokens;
  FP4MOE_CHECK(H >= 1 && C >= 1 && R >= 0, "mla_attention_cpu: {} heads, ckv {} kpe {}", H, C, R);
  FP4MOE_CHECK(L.ckv && (L.kpe || R == 0), "mla_attention_cpu: the layer has no ckv/kpe arrays");
  FP4MOE_CHECK(!prm.topk || prm.topk_k >= 1, "mla_attention_cpu: sparse with topk_k = {}", prm.topk_k);
  const int threads = prm.threads > 0 ? prm.threads : default_num_threads();
  if (prm.topk) validate_topk(b, prm.topk, prm.topk_k, threads);
  std::vector<int32_t> req(static_cast<size_t>(T));
  kv_token_requests(b, req.data());

  const int64_t head_blocks = (H + kHeadBlock - 1) / kHeadBlock;
  int64_t max_keys = 1;
  for (int64_t t = 0; t < T; ++t) max_keys = std::max<int64_t>(max_keys, prm.topk ? prm.topk_k : b.positions[t] + 1);
  parallel_for(T * head_blocks, threads, grain_for(max_keys * std::min(H, kHeadBlock) * 2 * (C + R)), [&](int64_t i0, int64_t i1) {
    std::vector<float> kc(size_t(kKeyBlock * C)), kr(size_t(kKeyBlock * std::max<int64_t>(R, 1)));
    std::vector<float> s(static_cast<size_t>(kKeyBlock)), m(static_cast<size_t>(kHeadBlock)), z(static_cast<size_t>(kHeadBlock));
    std::vector<int64_t> keys;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / head_blocks, h0 = (item % head_blocks) * kHeadBlock, h1 = std::min(H, h0 + kHeadBlock);
      const int64_t r = req[size_t(t)], p = b.positions[t];
      keys.clear();
      if (prm.topk) {
        for (int64_t i = 0; i < prm.topk_k; ++i)
          if (prm.topk[t * prm.topk_k + i] >= 0) keys.push_back(prm.topk[t * prm.topk_k + i]);
      } else {
        for (int64_t j = 0; j <= p; ++j) keys.push_back(j);
      }
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(z.begin(), z.end(), 0.0f);
      for (int64_t h = h0; h < h1; ++h) std::fill(out + (t * H + h) * C, out + (t * H + h + 1) * C, 0.0f);
      for (size_t k0 = 0; k0 < keys.size(); k0 += kKeyBlock) {
        const int64_t nk = std::min<int64_t>(kKeyBlock, int64_t(keys.size() - k0));
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t slot = kv_slot(b, L.page_size, r, keys[k0 + size_t(j)]);
          kv_decode(L.elem, L.ckv_scale, L.ckv, slot * C, C, kc.data() + j * C);
          if (R > 0) kv_decode(L.elem, L.kpe_scale, L.kpe, slot * R, R, kr.data() + j * R);
        }
        for (int64_t h = h0; h < h1; ++h) {
          const float* ql = q_latent + (t * H + h) * C;
          const float* qr = q_rope + (t * H + h) * R;
          float mb = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < nk; ++j) {
            s[size_t(j)] = prm.sm_scale * (dot_f32(ql, kc.data() + j * C, C) + (R > 0 ? dot_f32(qr, kr.data() + j * R, R) : 0.0f));
            mb = std::max(mb, s[size_t(j)]);
          }
          float& mh = m[size_t(h - h0)];
          float& zh = z[size_t(h - h0)];
          const float m_new = std::max(mh, mb);
          const float c = std::exp(mh - m_new);  // 0 on the first block (mh = -inf)
          float* o = out + (t * H + h) * C;
          zh *= c;
          for (int64_t j = 0; j < nk; ++j) {
            const float e = std::exp(s[size_t(j)] - m_new);
            zh += e;
            scale_axpy_f32(o, j == 0 ? c : 1.0f, e, kc.data() + j * C, C);
          }
          mh = m_new;
        }
      }
      for (int64_t h = h0; h < h1; ++h) {
        const float zh = z[size_t(h - h0)];
        float* o = out + (t * H + h) * C;
        if (zh > 0.0f) {
          const float inv = 1.0f / zh;
          for (int64_t i = 0; i < C; ++i) o[i] *= inv;
        }
        if (lse) lse[t * H + h] = zh > 0.0f ? m[size_t(h - h0)] + std::log(zh) : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

}  // namespace fp4moe::cpu
