#include "cpu/row_ops_cpu.hpp"

#include <algorithm>
#include <cmath>

#include "core/bf16.hpp"
#include "core/greedy_advance.hpp"

namespace fp4moe::cpu {

void rms_norm_rows_cpu(const float* x, int64_t xs, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * xs;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = float(double(w[i]) * (double(xr[i]) * inv));
  }
}

void layer_norm_rows_cpu(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                         float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double s = 0.0;
    for (int64_t i = 0; i < dim; ++i) s += xr[i];
    const double mean = s / double(dim);
    double v = 0.0;
    for (int64_t i = 0; i < dim; ++i) v += (xr[i] - mean) * (xr[i] - mean);
    const double inv = 1.0 / std::sqrt(v / double(dim) + double(eps));
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = float((xr[i] - mean) * inv * w[i] + b[i]);
  }
}

void rope_rows_cpu(float* x, int64_t T, int64_t heads, int64_t ts, int64_t hs, int64_t offset, int64_t rope_dim,
                   const int32_t* positions, const float* inv_freq, float af, bool interleaved) {
  const int64_t half = rope_dim / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * ts + h * hs + offset;
      for (int64_t i = 0; i < half; ++i) {
        const float a = inv_freq[i] * float(positions[t]);
        const double c = std::cos(double(a)) * af, s = std::sin(double(a)) * af;
        const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        const double x0 = v[ia], x1 = v[ib];
        v[ia] = float(x0 * c - x1 * s);
        v[ib] = float(x1 * c + x0 * s);
      }
    }
}

void embed_rows_cpu(const void* table, bool f32_table, const int32_t* tokens, int64_t T, int64_t H, float* x) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = int64_t(tokens[t]) * H;
    for (int64_t i = 0; i < H; ++i)
      x[t * H + i] = f32_table ? static_cast<const float*>(table)[row + i]
                               : bf16_to_float(static_cast<const uint16_t*>(table)[row + i]);
  }
}

void gather_rows_cpu(const uint16_t* src, int64_t dim, const int32_t* rows, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + int64_t(rows[i]) * dim, dim, dst + i * dim);
}

void silu_mul_cpu(const float* g, int64_t gs, const float* u, int64_t us, float* h, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double a = g[r * gs + i];
      h[r * n + i] = float(a / (1.0 + std::exp(-a)) * u[r * us + i]);
    }
}

void add_into_cpu(float* x, const float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += o[i];
}

void bf16_to_f32_scaled_cpu(const uint16_t* x, float* y, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]) * scale;
}

void f32_to_bf16_cpu(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

void moe_dense_combine_cpu(const float* y, const int32_t* ids, const float* wts, const float* shared, int64_t T,
                           int64_t k, int64_t H, float* out) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) {
      double a = 0.0;
      for (int64_t j = 0; j < k; ++j) a += double(wts[t * k + j]) * y[(int64_t(ids[t * k + j]) * T + t) * H + i];
      if (shared) a += shared[t * H + i];
      out[t * H + i] = float(a);
    }
}

void argmax_rows_cpu(const float* logits, int64_t rows, int64_t vocab, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    int64_t best = -1;
    for (int64_t v = 0; v < vocab; ++v)
      if (!std::isnan(row[v]) && (best < 0 || row[v] > row[best])) best = v;
    out[r] = int32_t(best < 0 ? 0 : best);
  }
}

void count_experts_cpu(const int32_t* ids, int64_t T, int64_t k, const int32_t* token_req, const int32_t* active,
                       int64_t E, int32_t* counts) {
  std::fill_n(counts, E, 0);
  for (int64_t i = 0; i < T * k; ++i)
    if (ids[i] >= 0 && ids[i] < E && active[token_req[i / k]] != 0) ++counts[ids[i]];
}

void chunk_qo_indptr_cpu(const int32_t* qo, int32_t R, int32_t r0, int32_t n, int32_t* out) {
  for (int32_t i = 0; i <= R; ++i) out[i] = std::min(std::max(qo[i] - r0, 0), n);
}

void greedy_advance_cpu(const GreedyAdvanceArgs& a, int32_t j) {
  for (int32_t r = 0; r < a.requests; ++r) {
    int32_t& out = a.out[int64_t(j) * a.requests + r];
    if (a.active[r] == 0) {
      out = -1;
      continue;
    }
    const int32_t t = a.greedy[r];
    out = t;
    const int32_t n = ++a.produced[r];
    if (a.draw) {
      ++a.draw[r];
      const int64_t at = int64_t(a.prompt_len[r]) + a.output_len[r];
      if (a.history && at < a.history_stride) a.history[int64_t(r) * a.history_stride + at] = t;
      ++a.output_len[r];
    }
    if (launch_finishes(t, n, a.max_new[r], a.stop_ids + int64_t(r) * a.stop_stride, a.stop_stride)) {
      a.active[r] = 0;
      if (a.done) a.done[r] = 1;
      a.positions[r] = 0;
      a.kv_len[r] = 1;
      a.page_indices[a.page_indptr[r]] = a.trash_page;
      continue;
    }
    a.tokens[r] = t;
    ++a.positions[r];
    ++a.kv_len[r];
  }
}

}  // namespace fp4moe::cpu
