#include "cpu/linear_cpu.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/avx2_weight_dot.hpp"
#include "cpu/scale_tables.hpp"
#include "cpu/vec_avx2.hpp"

namespace fp4moe::cpu {
namespace {

constexpr int64_t kRowsPerItem = 16;

Fp4MatrixView fp4_view(const LinearView& w) {
  return {w.format == LinearFormat::NVFP4 ? Fp4Format::NVFP4 : Fp4Format::MXFP4, w.n, w.k, w.packed, w.scales,
          w.global_scale};
}

void check(const LinearView& w) {
  FP4MOE_CHECK(w.n >= 0 && w.k >= 1, "linear: weight [{}, {}]", w.n, w.k);
  if (w.is_fp4()) {
    FP4MOE_CHECK(w.packed && w.scales && w.k % w.block() == 0, "linear: {} weight [{}, {}] without data or K % {} != 0",
                 linear_format_name(w.format), w.n, w.k, w.block());
  } else {
    FP4MOE_CHECK(w.data != nullptr, "linear: {} weight [{}, {}] without data", linear_format_name(w.format), w.n, w.k);
  }
}

// Rows [r0, r1) of W against a tile of mt token rows.
template <class MakeRow>
void rows_tile(MakeRow make_row, int64_t K, const float* const* xp, int mt, int64_t r0, int64_t r1, float* y,
               int64_t y_stride, int64_t t0) {
  float out[kMaxTokenTile];
  for (int64_t r = r0; r < r1; ++r) {
    dot_row_tile(make_row(r), K, xp, mt, out);
    for (int j = 0; j < mt; ++j) y[(t0 + j) * y_stride + r] = out[j];
  }
}

}  // namespace

std::string_view linear_format_name(LinearFormat f) {
  switch (f) {
    case LinearFormat::NVFP4: return "nvfp4";
    case LinearFormat::MXFP4: return "mxfp4";
    case LinearFormat::BF16: return "bf16";
    case LinearFormat::F32: return "f32";
  }
  return "?";
}

LinearView LinearView::rows(int64_t r0, int64_t r1) const {
  FP4MOE_CHECK(0 <= r0 && r0 <= r1 && r1 <= n, "linear: rows [{}, {}) of {}", r0, r1, n);
  LinearView v = *this;
  v.n = r1 - r0;
  switch (format) {
    case LinearFormat::NVFP4:
    case LinearFormat::MXFP4:
      v.packed = packed + r0 * (k / 2);
      v.scales = scales + r0 * (k / block());
      break;
    case LinearFormat::BF16: v.data = static_cast<const uint16_t*>(data) + r0 * k; break;
    case LinearFormat::F32: v.data = static_cast<const float*>(data) + r0 * k; break;
  }
  return v;
}

size_t LinearView::bytes() const {
  if (is_fp4()) return size_t(n * k / 2 + n * k / block());
  return size_t(n * k) * (format == LinearFormat::F32 ? 4 : 2);
}

void linear_cpu(const LinearView& w, const float* x, int64_t T, float* y, int threads) {
  linear_strided_cpu(w, x, w.k, T, y, w.n, threads);
}

void linear_strided_cpu(const LinearView& w, const float* x, int64_t xs, int64_t T, float* y, int64_t ys,
                        int threads) {
  check(w);
  FP4MOE_CHECK(xs >= w.k && ys >= w.n, "linear: row strides {} / {} for a [{}, {}] weight", xs, ys, w.n, w.k);
  if (T == 0 || w.n == 0) return;
  threads = threads > 0 ? threads : default_num_threads();
  const int64_t K = w.k, N = w.n;
  if (K % 16 != 0) {  // odd reduction dims (tiny test models only): plain FP32 loops
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < N; ++r) {
      linear_row_cpu(w, r, row.data());
      for (int64_t t = 0; t < T; ++t) y[t * ys + r] = dot_f32(row.data(), x + t * xs, K);
    }
    return;
  }
  const ScaleTable table = w.is_fp4() ? make_scale_table(fp4_view(w).format, w.global_scale) : ScaleTable{};
  const int64_t items = (N + kRowsPerItem - 1) / kRowsPerItem;
  parallel_for(items, threads, grain_for(kRowsPerItem * K * T), [&](int64_t i0, int64_t i1) {
    const float* xp[kMaxTokenTile];
    const int64_t r0 = i0 * kRowsPerItem, r1 = std::min(N, i1 * kRowsPerItem);
    for (int64_t t0 = 0; t0 < T; t0 += kMaxTokenTile) {
      const int mt = int(std::min<int64_t>(kMaxTokenTile, T - t0));
      for (int j = 0; j < mt; ++j) xp[j] = x + (t0 + j) * xs;
      switch (w.format) {
        case LinearFormat::NVFP4:
          rows_tile([&](int64_t r) { return Fp4Row<16>{w.packed + r * (K / 2), w.scales + r * (K / 16), table.data()}; },
                    K, xp, mt, r0, r1, y, ys, t0);
          break;
        case LinearFormat::MXFP4:
          rows_tile([&](int64_t r) { return Fp4Row<32>{w.packed + r * (K / 2), w.scales + r * (K / 32), table.data()}; },
                    K, xp, mt, r0, r1, y, ys, t0);
          break;
        case LinearFormat::BF16:
          rows_tile([&](int64_t r) { return Bf16Row{static_cast<const uint16_t*>(w.data) + r * K}; }, K, xp, mt, r0, r1,
                    y, ys, t0);
          break;
        case LinearFormat::F32:
          rows_tile([&](int64_t r) { return F32Row{static_cast<const float*>(w.data) + r * K}; }, K, xp, mt, r0, r1, y,
                    ys, t0);
          break;
      }
    }
  });
}

void linear_row_cpu(const LinearView& w, int64_t r, float* out) {
  FP4MOE_CHECK(r >= 0 && r < w.n, "linear: row {} of {}", r, w.n);
  switch (w.format) {
    case LinearFormat::NVFP4:
    case LinearFormat::MXFP4: dequantize_rows(fp4_view(w), r, r + 1, out); break;
    case LinearFormat::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * w.k;
      for (int64_t i = 0; i < w.k; ++i) out[i] = bf16_to_float(p[i]);
      break;
    }
    case LinearFormat::F32: std::memcpy(out, static_cast<const float*>(w.data) + r * w.k, size_t(w.k) * 4); break;
  }
}

void linear_t_accumulate_cpu(const LinearView& w, const float* x, int64_t xs, int64_t T, float* y, int64_t ys) {
  check(w);
  std::vector<float> row(static_cast<size_t>(w.k));
  for (int64_t r = 0; r < w.n; ++r) {
    linear_row_cpu(w, r, row.data());
    for (int64_t t = 0; t < T; ++t) axpy_f32(y + t * ys, x[t * xs + r], row.data(), w.k);
  }
}

}  // namespace fp4moe::cpu
