#include "cpu/attention/mla_expanded_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cpu/vec_avx2.hpp"

namespace fp4moe::cpu {

void mla_attention_expanded_cpu(const KvLayerView& L, const KvBatchView& b, const LinearView& kv_b,
                                const float* q_nope, const float* q_rope, const MlaExpandedParams& prm, float* out) {
  validate_kv_batch(b, L.page_size, L.num_pages);
  const int64_t H = prm.num_heads, N = prm.nope_dim, V = prm.v_dim, C = L.ckv_dim, R = L.kpe_dim;
  FP4MOE_CHECK(kv_b.n == H * (N + V) && kv_b.k == C, "mla expanded: kv_b is [{}, {}], expected [{}, {}]", kv_b.n,
               kv_b.k, H * (N + V), C);
  const int threads = prm.threads > 0 ? prm.threads : default_num_threads();
  const int64_t W = N + V;
  for (int64_t r = 0; r < b.num_requests; ++r) {
    const int64_t t0 = b.qo_indptr[r], t1 = b.qo_indptr[r + 1];
    if (t0 == t1) continue;
    int64_t n = 0;  // keys needed: positions [0, n)
    for (int64_t t = t0; t < t1; ++t) n = std::max<int64_t>(n, b.positions[t] + 1);
    std::vector<float> ckv(size_t(n * C)), kpe(size_t(n * std::max<int64_t>(R, 1))), kv(size_t(n * H * W));
    parallel_for(n, threads, 64, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t slot = kv_slot(b, L.page_size, r, j);
        kv_decode(L.elem, L.ckv_scale, L.ckv, slot * C, C, ckv.data() + j * C);
        if (R > 0) kv_decode(L.elem, L.kpe_scale, L.kpe, slot * R, R, kpe.data() + j * R);
      }
    });
    linear_cpu(kv_b, ckv.data(), n, kv.data(), threads);  // [n, H, nope + v]
    parallel_for((t1 - t0) * H, threads, grain_for(n * (N + R + V)), [&](int64_t i0, int64_t i1) {
      std::vector<int64_t> keys;
      std::vector<float> s;
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t t = t0 + item / H, h = item % H, p = b.positions[t];
        keys.clear();
        if (prm.topk) {
          for (int64_t i = 0; i < prm.topk_k; ++i) {
            const int32_t j = prm.topk[t * prm.topk_k + i];
            if (j < 0) continue;
            FP4MOE_CHECK(j <= p, "mla expanded: token {} (position {}) selects key position {}", t, p, j);
            keys.push_back(j);
          }
        } else {
          for (int64_t j = 0; j <= p; ++j) keys.push_back(j);
        }
        const float* qn = q_nope + (t * H + h) * N;
        const float* qr = q_rope + (t * H + h) * R;
        s.resize(keys.size());
        float mx = -std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < keys.size(); ++i) {
          const int64_t j = keys[i];
          s[i] = prm.sm_scale * (dot_f32(qn, kv.data() + (j * H + h) * W, N) + dot_f32(qr, kpe.data() + j * R, R));
          mx = std::max(mx, s[i]);
        }
        float* o = out + (t * H + h) * V;
        std::fill(o, o + V, 0.0f);
        float z = 0.0f;
        for (size_t i = 0; i < keys.size(); ++i) {
          const float e = std::exp(s[i] - mx);
          z += e;
          axpy_f32(o, e, kv.data() + (keys[i] * H + h) * W + N, V);
        }
        if (z > 0.0f)
          for (int64_t c = 0; c < V; ++c) o[c] /= z;
      }
    });
  }
}

}  // namespace fp4moe::cpu
