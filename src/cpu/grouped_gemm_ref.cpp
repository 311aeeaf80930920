#include "cpu/grouped_gemm_ref.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "format/fp4.hpp"

namespace fp4moe {

int64_t reference_cols(const GroupedGemmRef& r) { return r.epilogue == Epilogue::SiluMul ? r.w->n / 2 : r.w->n; }

namespace {

// Σ_k x[k]·w[k] in double over four chains (a fixed order, and some ILP); with kAbs also
// Σ_k |x[k]·w[k]|.
template <bool kAbs>
void dot_sums(const float* x, const float* w, int64_t K, double& sum, double& abs_sum) {
  double s[4] = {0.0, 0.0, 0.0, 0.0}, a[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 4 <= K; k += 4)
    for (int j = 0; j < 4; ++j) {
      const double p = double(x[k + j]) * double(w[k + j]);
      s[j] += p;
      if constexpr (kAbs) a[j] += std::fabs(p);
    }
  for (; k < K; ++k) {
    const double p = double(x[k]) * double(w[k]);
    s[0] += p;
    if constexpr (kAbs) a[0] += std::fabs(p);
  }
  sum = (s[0] + s[1]) + (s[2] + s[3]);
  abs_sum = (a[0] + a[1]) + (a[2] + a[3]);
}

}  // namespace

std::vector<double> grouped_gemm_reference(const GroupedGemmRef& r, const std::vector<int64_t>& rows, int threads,
                                           GroupedGemmSums* sums) {
  FP4MOE_CHECK(r.w && r.w->is_fp4() && r.x && r.offsets, "grouped_gemm_reference: missing weights, x or offsets");
  const ExpertStack& w = *r.w;
  const int64_t E = w.num_experts, N = w.n, K = w.k, cols = reference_cols(r);
  FP4MOE_CHECK(r.epilogue != Epilogue::RowScale || r.row_scale, "grouped_gemm_reference: RowScale needs row_scale");
  if (threads <= 0) threads = default_num_threads();

  // The activations as the GEMM sees them: BF16, or NVFP4 fake-quantized with a global g.
  double act_scale = 1.0;
  float g = 1.0f;
  if (r.nvfp4_act) {
    float amax = 0.0f;
    for (int64_t i = 0; i < r.m_total * K; ++i) amax = std::max(amax, std::fabs(bf16_to_float(r.x[i])));
    g = amax > 0.0f ? nvfp4_global_scale_from_amax(amax) : 1.0f;
    act_scale = g;
  }
  auto x_row = [&](int64_t m, std::vector<float>& out) {
    out.resize(size_t(K));
    for (int64_t k = 0; k < K; ++k) out[size_t(k)] = bf16_to_float(r.x[m * K + k]);
    if (r.nvfp4_act) {
      Fp4Matrix q = quantize_nvfp4(out.data(), 1, K, g);
      q.global_scale = 1.0f;  // the GEMM's epilogue applies g
      dequantize_rows(q.view(), 0, 1, out.data());
    }
  };

  // Rows grouped by expert: each expert's weight rows are decoded once for all its rows.
  std::map<int64_t, std::vector<size_t>> by_expert;  // expert -> indices into `rows`
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t m = rows[i];
    FP4MOE_CHECK(m >= 0 && m < r.offsets[E], "grouped_gemm_reference: row {} outside [0, {})", m, r.offsets[E]);
    const int64_t e = std::upper_bound(r.offsets, r.offsets + E + 1, int32_t(m)) - r.offsets - 1;
    by_expert[e].push_back(i);
  }
  std::vector<std::pair<int64_t, const std::vector<size_t>*>> work;
  for (const auto& [e, idx] : by_expert) work.emplace_back(e, &idx);

  std::vector<double> acc(rows.size() * size_t(N));
  std::vector<double> abs_acc(sums ? acc.size() : 0);
  // Work items: (expert, block of 64 weight rows).
  constexpr int64_t kRowsPerItem = 64;
  const int64_t blocks = (N + kRowsPerItem - 1) / kRowsPerItem;
  std::vector<std::vector<float>> xs(rows.size());
  parallel_for(int64_t(rows.size()), threads, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x_row(rows[size_t(i)], xs[size_t(i)]);
  });
  parallel_for(int64_t(work.size()) * blocks, threads, 1, [&](int64_t b, int64_t e) {
    std::vector<float> wrow(static_cast<size_t>(K));
    for (int64_t item = b; item < e; ++item) {
      const auto& [expert, idx] = work[size_t(item / blocks)];
      const int64_t n0 = (item % blocks) * kRowsPerItem, n1 = std::min(N, n0 + kRowsPerItem);
      const Fp4MatrixView v = w.expert(expert);
      for (int64_t n = n0; n < n1; ++n) {
        dequantize_rows(v, n, n + 1, wrow.data());
        for (size_t i : *idx) {
          double s = 0.0, a = 0.0;
          if (sums) dot_sums<true>(xs[i].data(), wrow.data(), K, s, a);
          else dot_sums<false>(xs[i].data(), wrow.data(), K, s, a);
          acc[i * size_t(N) + size_t(n)] = s * act_scale;
          if (sums) abs_acc[i * size_t(N) + size_t(n)] = a * act_scale;
        }
      }
    }
  });

  std::vector<double> y(rows.size() * size_t(cols));
  for (size_t i = 0; i < rows.size(); ++i) {
    const double* a = acc.data() + i * size_t(N);
    double* yr = y.data() + i * size_t(cols);
    for (int64_t j = 0; j < cols; ++j) {
      if (r.epilogue == Epilogue::SiluMul) {
        const double gt = a[j], up = a[N / 2 + j];
        yr[j] = gt / (1.0 + std::exp(-gt)) * up;
      } else {
        yr[j] = a[j] * (r.epilogue == Epilogue::RowScale ? double(r.row_scale[rows[i]]) : 1.0);
      }
    }
  }
  if (sums) {
    sums->acc = std::move(acc);
    sums->abs_acc = std::move(abs_acc);
  }
  return y;
}

std::vector<int64_t> sample_rows(const int32_t* offsets, int64_t num_experts, int64_t count) {
  const int64_t M = offsets[num_experts];
  std::vector<int64_t> rows;
  if (M <= 0 || count <= 0) return rows;
  if (count >= M) {
    for (int64_t m = 0; m < M; ++m) rows.push_back(m);
    return rows;
  }
  // Half the budget: the first and last rows of experts spread over those that have rows
  // (tile edges); the other half: rows spread evenly over [0, M).
  std::vector<int64_t> hit;
  for (int64_t e = 0; e < num_experts; ++e)
    if (offsets[e + 1] > offsets[e]) hit.push_back(e);
  const int64_t edge_experts = std::min<int64_t>(int64_t(hit.size()), count / 4);
  for (int64_t i = 0; i < edge_experts; ++i) {
    const int64_t e = hit[size_t(i * int64_t(hit.size()) / edge_experts)];
    rows.push_back(offsets[e]);
    rows.push_back(offsets[e + 1] - 1);
  }
  const int64_t left = count - 2 * edge_experts;
  for (int64_t i = 0; i < left; ++i) rows.push_back(i * M / left);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

RowErrors compare_rows(const std::vector<float>& got, const std::vector<double>& ref, int64_t cols, double tol) {
  FP4MOE_CHECK(cols > 0 && got.size() == ref.size() && ref.size() % size_t(cols) == 0,
               "compare_rows: {} values against {} ({} per row)", got.size(), ref.size(), cols);
  RowErrors out;
  const int64_t rows = int64_t(ref.size()) / cols;
  for (int64_t i = 0; i < rows; ++i) {
    double num = 0, den = 0;
    bool finite = true;
    for (int64_t j = 0; j < cols; ++j) {
      const double a = got[size_t(i * cols + j)], b = ref[size_t(i * cols + j)];
      finite = finite && std::isfinite(a);
      num += (a - b) * (a - b);
      den += b * b;
    }
    const double err = !finite ? INFINITY : den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (!(err <= tol)) ++out.bad_rows;
    if (out.worst_row < 0 || !(err <= out.worst)) {
      out.worst = err;
      out.worst_row = i;
    }
  }
  return out;
}

}  // namespace fp4moe
