// The backend-ops table: every small op of the model runner (src/cuda families norm, rope,
// embed, elementwise, attention/mla_warp_bf16, indexer/indexer_score_warp_bf16,
// permute/dense_combine_f32, sampling/argmax_f32, sampling/token_bitmask_f32, step) against its CPU reference (cpu/
// row_ops_cpu.hpp, core/greedy_advance.hpp, cpu/attention/*), on random inputs, outputs poisoned
// before the launch, compared per row. One row of the table per launch variant the code can
// take (input dtype, in place or not, RoPE layout, dense or top-k attention, greedy or sampled
// bookkeeping, ...), at shapes that cross each kernel's loop and block boundaries. Each case
// states its tolerance and how it follows from the dtypes (units in ops_util.hpp).
// `op_rows<B>(big)`: big = false keeps shapes small enough for the CPU emulator.
#pragma once

#include <algorithm>
#include <climits>
#include <cstring>
#include <set>

#include "cpu/attention/indexer_cpu.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cpu/attention/mla_cpu.hpp"
#include "core/greedy_advance.hpp"
#include "core/spec_accept.hpp"
#include "cpu/row_ops_cpu.hpp"
#include "cpu/sampling_cpu.hpp"
#include "ops/ops_util.hpp"

namespace fp4moe::test::ops {

// ---- norm ------------------------------------------------------------------------------------
// RMSNorm → BF16: the output's one BF16 rounding (2^-9) plus the FP32 path before it: the sum of
// squares over dim terms (dim · 2^-24 relative, halved by the square root) and ~6 more roundings
// (mean, eps, sqrt, division, two products). Bound = 2 × that, relative to the row's norm.
// amp: the inputs' range; at 3e-3 the mean square is ~3e-6, so eps (1e-6) moves the outputs by
// ~15 %, far past the bound: a wrong eps fails.
// x rows at a stride of dim + pad, y rows at dim + ypad: 16-byte-aligned rows take the vector
// loads and stores of the register form, others (and the tail past the last whole 16-byte
// chunk) the scalar ones. v0: the previous (strided) form, the bench's baseline.
template <class B>
void rms_norm_case(bool bf16_in, int rows, int dim, int pad, uint64_t seed, float amp = 3.0f, int ypad = 3,
                   bool v0 = false) {
  Rng rng(seed);
  const int64_t xs = dim + pad, ys = dim + ypad;
  std::vector<uint16_t> x16 = rand_bf16(rng, size_t(rows * xs), -amp, amp);
  std::vector<float> x32 = bf16_in ? widen(x16) : rand_f32(rng, size_t(rows * xs), -amp, amp);
  const std::vector<float> w = rand_f32(rng, size_t(dim), 0.5f, 1.5f);
  const float eps = 1e-6f;
  auto dy = B::up(std::vector<uint16_t>(size_t(rows * ys), kPoisonBf16));
  auto dw = B::up(w);
  if (bf16_in) {
    auto dx = B::up(x16);
    if (v0) B::rms_norm_v0(dx.p(), xs, rows, dim, dw.p(), eps, dy.p(), ys);
    else B::rms_norm(dx.p(), xs, rows, dim, dw.p(), eps, dy.p(), ys);
  } else {
    auto dx = B::up(x32);
    if (v0) B::rms_norm_v0(dx.p(), xs, rows, dim, dw.p(), eps, dy.p(), ys);
    else B::rms_norm(dx.p(), xs, rows, dim, dw.p(), eps, dy.p(), ys);
  }
  const std::vector<uint16_t> y = B::down(dy);
  std::vector<float> ref(static_cast<size_t>(rows * dim));
  cpu::rms_norm_rows_cpu(x32.data(), xs, rows, dim, w.data(), eps, ref.data());
  const double rel = 2.0 * (kBf16Rel + (dim / 2.0 + 6.0) * kF32Rel);
  expect_rows_close("rms_norm", widen(y), ys, ref, rows, dim, [&](int64_t, double n) { return rel * n; });
  for (int64_t r = 0; r < rows; ++r)  // the stride's gap is not the op's
    for (int64_t i = dim; i < ys; ++i) ASSERT_EQ(y[size_t(r * ys + i)], kPoisonBf16) << "rms_norm wrote past dim";
}

// RMSNorm in place (BF16 rows, y = x: the runner's q_a norm), the bound of rms_norm_case.
template <class B>
void rms_norm_in_place_case(int rows, int dim, uint64_t seed) {
  Rng rng(seed);
  const std::vector<uint16_t> x16 = rand_bf16(rng, size_t(rows) * dim, -3.0f, 3.0f);
  const std::vector<float> w = rand_f32(rng, size_t(dim), 0.5f, 1.5f), x32 = widen(x16);
  auto dx = B::up(x16);
  auto dw = B::up(w);
  B::rms_norm(dx.p(), dim, rows, dim, dw.p(), 1e-6f, dx.p(), dim);
  std::vector<float> ref(size_t(rows) * dim);
  cpu::rms_norm_rows_cpu(x32.data(), dim, rows, dim, w.data(), 1e-6f, ref.data());
  const double rel = 2.0 * (kBf16Rel + (dim / 2.0 + 6.0) * kF32Rel);
  expect_rows_close("rms_norm (in place)", widen(B::down(dx)), dim, ref, rows, dim,
                    [&](int64_t, double n) { return rel * n; });
}

// LayerNorm (BF16 → BF16, weight and bias): the BF16 rounding, plus FP32 mean and variance sums
// (dim terms each): the mean is off by dim · 2^-24 · mean|x|, which moves every output by that
// times |w| / std; the variance's relative error (dim + 6) · 2^-24 moves each output by that
// fraction of itself. Bound = 2 × the sum, in the row's L2 norm. Inputs have a mean of ~0.5.
template <class B>
void layer_norm_case(bool in_place, int rows, int dim, uint64_t seed) {
  Rng rng(seed);
  const std::vector<uint16_t> x16 = rand_bf16(rng, size_t(rows * dim), -1.0f, 2.0f);
  const std::vector<float> x32 = widen(x16), w = rand_f32(rng, size_t(dim), 0.5f, 1.5f),
                           b = rand_f32(rng, size_t(dim), -0.5f, 0.5f);
  const float eps = 1e-6f;
  auto dx = B::up(x16);
  auto dy = B::up(std::vector<uint16_t>(size_t(rows * dim), kPoisonBf16));
  auto dw = B::up(w);
  auto db = B::up(b);
  B::layer_norm(dx.p(), rows, dim, dw.p(), db.p(), eps, in_place ? dx.p() : dy.p());
  const std::vector<float> y = widen(B::down(in_place ? dx : dy));
  std::vector<float> ref(static_cast<size_t>(rows * dim));
  cpu::layer_norm_rows_cpu(x32.data(), rows, dim, w.data(), b.data(), eps, ref.data());
  double w_norm = 0.0;
  for (float v : w) w_norm += double(v) * v;
  w_norm = std::sqrt(w_norm);
  expect_rows_close(in_place ? "layer_norm (in place)" : "layer_norm", y, dim, ref, rows, dim, [&](int64_t r, double n) {
    double s = 0.0, s2 = 0.0, a = 0.0;
    for (int i = 0; i < dim; ++i) {
      const double v = x32[size_t(r * dim + i)];
      s += v;
      a += std::abs(v);
    }
    const double mean = s / dim;
    for (int i = 0; i < dim; ++i) s2 += (x32[size_t(r * dim + i)] - mean) * (x32[size_t(r * dim + i)] - mean);
    const double inv = 1.0 / std::sqrt(s2 / dim + eps);
    return 2.0 * (kBf16Rel * n + w_norm * dim * kF32Rel * (a / dim) * inv + (dim + 6.0) * kF32Rel * n);
  });
}

// ---- rope ------------------------------------------------------------------------------------
// In place on the rope part of each head (MLA query layout: token stride > heads · head_dim,
// the part at an offset). Both sides form the FP32 angle the same way; cosf / sinf are within
// 2 ulp, the rotation adds ~4 roundings: 8 · 2^-24 of (|x| + |y|), then the BF16 rounding
// (2^-9 of |y|). Bound = 2 × that per (token, head) row; everything outside the parts is
// unchanged, bit for bit.
template <class B>
void rope_case(bool interleaved, int T, int heads, int head_dim, int offset, int rope_dim, float af, uint64_t seed) {
  Rng rng(seed);
  const int64_t ts = int64_t(heads) * head_dim + 8, hs = head_dim;
  const std::vector<uint16_t> x16 = rand_bf16(rng, size_t(T * ts), -2.0f, 2.0f);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int32_t& p : pos) p = rng.integer(0, 5000);
  std::vector<float> inv_freq(static_cast<size_t>(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i) inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * i / rope_dim));
  auto dx = B::up(x16);
  auto dp = B::up(pos);
  auto df = B::up(inv_freq);
  B::rope(dx.p(), T, heads, ts, hs, offset, rope_dim, dp.p(), df.p(), af, interleaved);
  const std::vector<uint16_t> y16 = B::down(dx);
  std::vector<float> ref = widen(x16);
  cpu::rope_rows_cpu(ref.data(), T, heads, ts, hs, offset, rope_dim, pos.data(), inv_freq.data(), af, interleaved);
  std::vector<float> got_part, ref_part, x_part;
  std::vector<bool> in_part(size_t(T * ts), false);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < rope_dim; ++i) {
        const size_t at = size_t(t * ts + h * hs + offset + i);
        in_part[at] = true;
        got_part.push_back(bf16_to_float(y16[at]));
        ref_part.push_back(ref[at]);
        x_part.push_back(bf16_to_float(x16[at]));
      }
  expect_rows_close(interleaved ? "rope (interleaved)" : "rope (halves)", got_part, rope_dim, ref_part, T * heads,
                    rope_dim, [&](int64_t r, double n) {
                      double xn = 0.0;
                      for (int i = 0; i < rope_dim; ++i) xn += double(x_part[size_t(r * rope_dim + i)]) * x_part[size_t(r * rope_dim + i)];
                      return 2.0 * (kBf16Rel * n + 8.0 * kF32Rel * (n + af * std::sqrt(xn)));
                    });
  for (size_t i = 0; i < in_part.size(); ++i) {
    if (!in_part[i]) {
      ASSERT_EQ(y16[i], x16[i]) << "rope changed a value outside the rope parts at " << i;
    }
  }
}

// ---- embed -----------------------------------------------------------------------------------
// Copies (BF16 → FP32 is exact): bit for bit.
template <class B>
void embed_case(bool f32_table, int T, int H, int vocab, uint64_t seed, bool v0 = false) {
  Rng rng(seed);
  std::vector<int32_t> tok(static_cast<size_t>(T));
  for (int32_t& t : tok) t = rng.integer(0, vocab - 1);
  tok[0] = vocab - 1;
  const std::vector<uint16_t> t16 = rand_bf16(rng, size_t(vocab) * H, -1.0f, 1.0f);
  const std::vector<float> t32 = rand_f32(rng, size_t(vocab) * H, -1.0f, 1.0f);
  auto dt16 = B::up(t16);
  auto dt32 = B::up(t32);
  auto dtok = B::up(tok);
  auto dx = B::up(std::vector<float>(size_t(T * H), kPoisonF32));
  const void* table = f32_table ? static_cast<const void*>(dt32.p()) : static_cast<const void*>(dt16.p());
  if (v0) B::embed_rows_v0(table, f32_table, dtok.p(), T, H, dx.p());
  else B::embed_rows(table, f32_table, dtok.p(), T, H, dx.p());
  std::vector<float> ref(static_cast<size_t>(T * H));
  cpu::embed_rows_cpu(f32_table ? static_cast<const void*>(t32.data()) : static_cast<const void*>(t16.data()),
                      f32_table, tok.data(), T, H, ref.data());
  expect_equal(f32_table ? "embed_rows (FP32 table)" : "embed_rows (BF16 table)", B::down(dx), ref);
}

template <class B>
void gather_case(int n, int dim, int src_rows, uint64_t seed, bool v0 = false) {
  Rng rng(seed);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int32_t& r : rows) r = rng.integer(0, src_rows - 1);
  const std::vector<uint16_t> src = rand_bf16(rng, size_t(src_rows * dim), -1.0f, 1.0f);
  auto ds = B::up(src);
  auto dr = B::up(rows);
  auto dd = B::up(std::vector<uint16_t>(size_t(n * dim), kPoisonBf16));
  if (v0) B::gather_rows_v0(ds.p(), dim, dr.p(), n, dd.p());
  else B::gather_rows(ds.p(), dim, dr.p(), n, dd.p());
  std::vector<uint16_t> ref(static_cast<size_t>(n * dim));
  cpu::gather_rows_cpu(src.data(), dim, rows.data(), n, ref.data());
  expect_equal("gather_rows", B::down(dd), ref);
}

// ---- elementwise -----------------------------------------------------------------------------
// SiLU·up → BF16, |g| < 8: __expf is within 2 + 1.173·|x| ulp (<= 11 ulp here), then 1 + e, the
// division and the product: <= 16 · 2^-24 relative; then the BF16 rounding. Bound = 2 × that.
template <class B>
void silu_mul_case(int rows, int n, int pad, uint64_t seed) {
  Rng rng(seed);
  const int64_t stride = 2 * int64_t(n) + pad;  // gate then up in one row, as the runner's fused gate_up
  const std::vector<uint16_t> gu = rand_bf16(rng, size_t(rows * stride), -8.0f, 8.0f);
  auto dgu = B::up(gu);
  auto dh = B::up(std::vector<uint16_t>(size_t(rows) * n, kPoisonBf16));
  B::silu_mul(dgu.p(), stride, dgu.p() + n, stride, dh.p(), rows, n);
  const std::vector<float> g32 = widen(gu);
  std::vector<float> ref(size_t(rows) * n);
  cpu::silu_mul_cpu(g32.data(), stride, g32.data() + n, stride, ref.data(), rows, n);
  const double rel = 2.0 * (kBf16Rel + 16.0 * kF32Rel);
  expect_rows_close("silu_mul", widen(B::down(dh)), n, ref, rows, n, [&](int64_t, double nr) { return rel * nr; });
}

// x += o, BF16 → FP32 · scale, FP32 → BF16: one rounding each, the reference's: bit for bit.
template <class B>
void add_into_case(bool bf16_o, int64_t n, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> x = rand_f32(rng, size_t(n), -4.0f, 4.0f), o32 = rand_f32(rng, size_t(n), -4.0f, 4.0f);
  const std::vector<uint16_t> o16 = rand_bf16(rng, size_t(n), -4.0f, 4.0f);
  auto dx = B::up(x);
  auto do32 = B::up(o32);
  auto do16 = B::up(o16);
  if (bf16_o)
    B::add_into(dx.p(), do16.p(), n);
  else
    B::add_into(dx.p(), do32.p(), n);
  std::vector<float> ref = x;
  const std::vector<float> o = bf16_o ? widen(o16) : o32;
  cpu::add_into_cpu(ref.data(), o.data(), n);
  expect_equal(bf16_o ? "add_into (BF16)" : "add_into (FP32)", B::down(dx), ref);
}

template <class B>
void convert_case(int64_t n, uint64_t seed) {
  Rng rng(seed);
  const std::vector<uint16_t> x16 = rand_bf16(rng, size_t(n), -100.0f, 100.0f);
  std::vector<float> x32 = rand_f32(rng, size_t(n), -100.0f, 100.0f);
  // Rounding edge cases: ties to even both ways, the largest finite, infinities, a subnormal.
  const float edges[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f, INFINITY, -INFINITY, 1e-40f, 0.0f};
  for (size_t i = 0; i < std::size(edges) && i < x32.size(); ++i) x32[i] = edges[i];
  auto dx16 = B::up(x16);
  auto dx32 = B::up(x32);
  auto dy32 = B::up(std::vector<float>(size_t(n), kPoisonF32));
  auto dy16 = B::up(std::vector<uint16_t>(size_t(n), kPoisonBf16));
  B::bf16_to_f32_scaled(dx16.p(), dy32.p(), n, 0.37f);
  B::f32_to_bf16(dx32.p(), dy16.p(), n);
  std::vector<float> r32(static_cast<size_t>(n));
  std::vector<uint16_t> r16(static_cast<size_t>(n));
  cpu::bf16_to_f32_scaled_cpu(x16.data(), r32.data(), n, 0.37f);
  cpu::f32_to_bf16_cpu(x32.data(), r16.data(), n);
  expect_equal("bf16_to_f32_scaled", B::down(dy32), r32);
  expect_equal("f32_to_bf16", B::down(dy16), r16);
}

// ---- permute/dense_combine_f32 ----------------------------------------------------------------
// FP32 sum of k products (+ the shared row), in slot order, maybe with FMA: off from the FP64
// reference by <= (k + 2) · 2^-24 · (Σ|w·y| + |shared|) per value. Bound = 2 × that (row L2 of the
// per-value bounds).
template <class B>
void dense_combine_case(bool shared, int T, int k, int H, int E, uint64_t seed) {
  Rng rng(seed);
  const std::vector<float> y = rand_f32(rng, size_t(E) * T * H, -3.0f, 3.0f), sh = rand_f32(rng, size_t(T * H), -3.0f, 3.0f);
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> e(static_cast<size_t>(E));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng.g);
    for (int j = 0; j < k; ++j) {
      ids[size_t(t * k + j)] = e[size_t(j)];
      wts[size_t(t * k + j)] = rng.uni(0.0f, 1.0f);
    }
  }
  auto dy = B::up(y);
  auto dids = B::up(ids);
  auto dw = B::up(wts);
  auto dsh = B::up(sh);
  auto dout = B::up(std::vector<float>(size_t(T * H), kPoisonF32));
  B::moe_dense_combine_f32(dy.p(), dids.p(), dw.p(), shared ? dsh.p() : nullptr, T, k, H, dout.p());
  std::vector<float> ref(static_cast<size_t>(T * H));
  cpu::moe_dense_combine_cpu(y.data(), ids.data(), wts.data(), shared ? sh.data() : nullptr, T, k, H, ref.data());
  expect_rows_close(shared ? "moe_dense_combine_f32 (+ shared)" : "moe_dense_combine_f32", B::down(dout), H, ref, T, H,
                    [&](int64_t t, double) {
                      double s2 = 0.0;
                      for (int i = 0; i < H; ++i) {
                        double a = shared ? std::abs(sh[size_t(t * H + i)]) : 0.0;
                        for (int j = 0; j < k; ++j)
                          a += std::abs(wts[size_t(t * k + j)] * y[(size_t(ids[size_t(t * k + j)]) * T + size_t(t)) * H + i]);
                        s2 += a * a;
                      }
                      return 2.0 * (k + 2) * kF32Rel * std::sqrt(s2);
                    });
}

// ---- sampling/argmax_f32 ----------------------------------------------------------------------
// Exact: ties go to the lower id, NaN never wins, a row of NaNs gives 0, a row of −inf gives 0,
// −0 and +0 tie. Rows cycle through patterns that put the maximum where the kernel's pieces
// meet: ties across the 4,096-value passes (a split CTA's slice boundary, whatever the row's
// 16-byte misalignment), the unaligned head and the scalar tail, a larger value in a later slice.
// form: 0 one CTA per row (no workspace), 1 the split form (workspace; launched twice, and the
// workspace must be all zeros after each launch), 2 the previous form (the bench's baseline).
template <class B>
void argmax_case(int vocab, uint64_t seed, int rows = 6, int form = 0) {
  Rng rng(seed);
  const int V = vocab;
  std::vector<float> l = rand_f32(rng, size_t(rows) * V, -10.0f, 10.0f);
  auto at = [&](int r, int i) -> float& { return l[size_t(r) * V + size_t(std::clamp(i, 0, V - 1))]; };
  for (int r = 0; r < rows; ++r) {
    const int a = rng.integer(0, V - 1), b = rng.integer(0, V - 1), mid = V > 8192 ? (V / 4096 / 2) * 4096 : V / 2;
    switch (r % 11) {
      case 0: break;  // random
      case 1: at(r, a) = 50.0f, at(r, b) = 50.0f; break;  // a tie anywhere
      case 2: at(r, a) = NAN, at(r, V - 1) = 60.0f, at(r, 0) = NAN; break;  // NaNs, one where the max would be
      case 3: std::fill_n(&at(r, 0), V, NAN); break;
      case 4: std::fill_n(&at(r, 0), V, -INFINITY); break;
      case 5: at(r, V - 1) = 1e30f; break;  // the tail
      case 6:
        for (int i = mid - 3; i <= mid + 4; ++i) at(r, i) = 70.0f;  // ties across a pass / slice boundary
        break;
      case 7:  // −0 before +0: they tie, the lower id wins
        for (int i = 0; i < V; ++i) at(r, i) = -1.0f - float(i % 7);
        at(r, std::min(3, V - 1)) = -0.0f, at(r, std::min(10, V - 1)) = 0.0f;
        break;
      case 8:  // +0 before −0
        for (int i = 0; i < V; ++i) at(r, i) = -1.0f - float(i % 5);
        at(r, std::min(2, V - 1)) = 0.0f, at(r, std::min(5, V - 1)) = -0.0f;
        break;
      case 9: std::fill_n(&at(r, 0), V, 1.5f); break;  // every id ties: 0
      case 10: at(r, V / 3) = 80.0f, at(r, std::max(V - 5, 0)) = 81.0f, at(r, V / 3 + 1) = 81.0f; break;
    }
  }
  auto dl = B::up(l);
  auto dout = B::up(std::vector<int32_t>(size_t(rows), kPoisonI32));
  std::vector<int32_t> ref(static_cast<size_t>(rows));
  cpu::argmax_rows_cpu(l.data(), rows, V, ref.data());
  if (form == 2) {
    B::argmax_rows_f32_v0(dl.p(), rows, V, dout.p());
    expect_equal("argmax_rows_f32_v0", B::down(dout), ref);
  } else if (form == 1) {
    const size_t wsb = B::argmax_workspace_bytes();
    auto dws = B::up(std::vector<uint8_t>(wsb, 0));
    for (int launch = 0; launch < 2; ++launch) {  // the second finds the workspace as the first left it
      auto dout2 = B::up(std::vector<int32_t>(size_t(rows), kPoisonI32));
      B::argmax_rows_f32(dl.p(), rows, V, dout2.p(), dws.p(), wsb);
      expect_equal("argmax_rows_f32 (split, launch " + std::to_string(launch) + ")", B::down(dout2), ref);
      const std::vector<uint8_t> ws = B::down(dws);
      ASSERT_EQ(size_t(std::count(ws.begin(), ws.end(), uint8_t(0))), ws.size())
          << "the workspace must be all zeros after a launch";
    }
  } else {
    B::argmax_rows_f32(dl.p(), rows, V, dout.p());
    expect_equal("argmax_rows_f32", B::down(dout), ref);
  }
}

// ---- sampling/token_bitmask_f32 ----------------------------------------------------------------
// Exact (a store of -inf or nothing). Rows: unconstrained (slot -1: untouched, NaN included),
// one allowed token, every token allowed, random words, none allowed (the kernel's job is only
// the -inf; the scheduler never samples such a row), the last word's bits past vocab set, and two
// rows sharing a slot. The logits rows are strided: the gap past vocab must stay poisoned. Then
// the greedy argmax over the masked rows equals the CPU's (the runner's masked greedy step).
template <class B>
void token_bitmask_case(int vocab, int pad, uint64_t seed) {
  Rng rng(seed);
  constexpr int kRows = 8;
  const int64_t W = (vocab + 31) / 32, stride = vocab + pad;
  std::vector<float> l = rand_f32(rng, size_t(kRows * stride), -10.0f, 10.0f);
  for (int r = 0; r < kRows; ++r)
    for (int64_t i = vocab; i < stride; ++i) l[size_t(r * stride + i)] = kPoisonF32;
  l[3] = NAN;  // row 0 is unconstrained: its NaN stays
  const int32_t one = rng.integer(0, vocab - 1);
  std::vector<std::vector<uint32_t>> slots(6, std::vector<uint32_t>(size_t(W), 0u));
  slots[0][size_t(one >> 5)] = 1u << (one & 31);                                    // one token
  std::fill(slots[1].begin(), slots[1].end(), ~0u);                                // all (bits past vocab too)
  for (auto& w : slots[2]) w = uint32_t(rng.integer(INT32_MIN, INT32_MAX));        // random words
  for (auto& w : slots[3]) w = rng.integer(0, 9) == 0 ? uint32_t(rng.integer(INT32_MIN, INT32_MAX)) : 0u;  // sparse
  slots[4][size_t(W - 1)] = ~0u;  // only the last word: its bits past vocab must not matter
  // slots[5]: none allowed
  const std::vector<int32_t> slot = {-1, 0, 1, 2, 3, 4, 5, 2};  // rows 3 and 7 share slot 2
  std::vector<uint32_t> packed;
  for (const auto& s : slots) packed.insert(packed.end(), s.begin(), s.end());
  auto dl = B::up(l);
  auto ds = B::up(slot);
  auto dm = B::up(packed);
  B::apply_token_bitmask_f32(dl.p(), stride, kRows, vocab, ds.p(), dm.p(), W);
  std::vector<float> ref = l;
  for (int r = 0; r < kRows; ++r)
    if (slot[size_t(r)] >= 0) cpu::apply_token_bitmask(ref.data() + r * stride, vocab, slots[size_t(slot[size_t(r)])].data());
  const std::vector<float> got = B::down(dl);
  ASSERT_EQ(got.size(), ref.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], 4) != 0) {  // bitwise: NaN poison and -inf compared too
      ADD_FAILURE() << "token_bitmask_f32[row " << i / size_t(stride) << ", " << i % size_t(stride) << "]: got "
                    << got[i] << ", reference " << ref[i];
      if (++bad >= 5) break;
    }
  // Masked greedy: the argmax of the masked rows (contiguous, as the runner's logits are).
  std::vector<float> dense(size_t(kRows) * vocab);
  for (int r = 0; r < kRows; ++r) std::copy_n(got.data() + r * stride, vocab, dense.data() + size_t(r) * vocab);
  auto dd = B::up(dense);
  auto dout = B::up(std::vector<int32_t>(kRows, kPoisonI32));
  B::argmax_rows_f32(dd.p(), kRows, vocab, dout.p());
  std::vector<int32_t> am(kRows);
  cpu::argmax_rows_cpu(dense.data(), kRows, vocab, am.data());
  expect_equal("argmax after token_bitmask_f32", B::down(dout), am);
  EXPECT_EQ(am[1], one) << "the one allowed token is the masked argmax";
}

// ---- step ------------------------------------------------------------------------------------
template <class B>
void count_experts_case(int T, int k, int E, uint64_t seed) {
  Rng rng(seed);
  const int R = std::max(1, T / 3);
  std::vector<int32_t> ids(static_cast<size_t>(T * k)), req(static_cast<size_t>(T)), active(static_cast<size_t>(R));
  for (int32_t& e : ids) e = rng.integer(-1, E);  // -1 and E are not experts: not counted
  for (int t = 0; t < T; ++t) req[size_t(t)] = t * R / T;
  for (int32_t& a : active) a = rng.integer(0, 3) != 0;
  auto di = B::up(ids);
  auto dr = B::up(req);
  auto da = B::up(active);
  auto dc = B::up(std::vector<int32_t>(size_t(E), kPoisonI32));
  B::count_experts(di.p(), T, k, dr.p(), da.p(), E, dc.p());
  std::vector<int32_t> ref(static_cast<size_t>(E));
  cpu::count_experts_cpu(ids.data(), T, k, req.data(), active.data(), E, ref.data());
  expect_equal("count_experts", B::down(dc), ref);
}

template <class B>
void chunk_qo_case(int R, int r0, int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> qo(size_t(R + 1), 0);
  for (int i = 1; i <= R; ++i) qo[size_t(i)] = qo[size_t(i - 1)] + rng.integer(0, 5);
  auto dq = B::up(qo);
  auto dout = B::up(std::vector<int32_t>(size_t(R + 1), kPoisonI32));
  B::chunk_qo_indptr(dq.p(), R, r0, n, dout.p());
  std::vector<int32_t> ref(static_cast<size_t>(R + 1));
  cpu::chunk_qo_indptr_cpu(qo.data(), R, r0, n, ref.data());
  expect_equal("chunk_qo_indptr", B::down(dout), ref);
}

// K steps of the K-step decode bookkeeping on the same state, every array compared after every
// step. Requests finish by length, by a stop id, or were finished before; sampled launches also
// advance draw indices, output counts and penalty histories (some past their stride).
template <class B>
void greedy_advance_case(bool sampled, int requests, int K, uint64_t seed) {
  Rng rng(seed);
  const int S = 3, trash = 999;
  const int64_t hist_stride = 12;
  std::vector<int32_t> tokens(static_cast<size_t>(requests)), positions(static_cast<size_t>(requests)), kv_len(static_cast<size_t>(requests)),
      page_indptr(static_cast<size_t>(requests + 1)), page_indices, active(static_cast<size_t>(requests)), max_new(static_cast<size_t>(requests)),
      stop_ids(static_cast<size_t>(requests * S)), produced(size_t(requests), 0), out(size_t(K * requests), kPoisonI32),
      draw(static_cast<size_t>(requests)), output_len(static_cast<size_t>(requests)), prompt_len(static_cast<size_t>(requests)),
      history(size_t(requests * hist_stride), kPoisonI32), done(size_t(requests), 0);
  for (int r = 0; r < requests; ++r) {
    positions[size_t(r)] = rng.integer(5, 40);
    kv_len[size_t(r)] = positions[size_t(r)] + 1;
    page_indptr[size_t(r)] = int32_t(page_indices.size());
    for (int p = 0; p < 3; ++p) page_indices.push_back(rng.integer(0, 500));
    active[size_t(r)] = rng.integer(0, 4) != 0;
    max_new[size_t(r)] = rng.integer(1, K + 1);
    for (int q = 0; q < S; ++q) stop_ids[size_t(r * S + q)] = q < 2 ? rng.integer(0, 20) : -1;
    draw[size_t(r)] = rng.integer(0, 9);
    output_len[size_t(r)] = rng.integer(0, 4);
    prompt_len[size_t(r)] = rng.integer(1, 9);
  }
  page_indptr[size_t(requests)] = int32_t(page_indices.size());
  auto d_tokens = B::up(tokens);
  auto d_pos = B::up(positions);
  auto d_kvl = B::up(kv_len);
  auto d_pip = B::up(page_indptr);
  auto d_pidx = B::up(page_indices);
  auto d_act = B::up(active);
  auto d_max = B::up(max_new);
  auto d_stop = B::up(stop_ids);
  auto d_prod = B::up(produced);
  auto d_out = B::up(out);
  auto d_draw = B::up(draw);
  auto d_olen = B::up(output_len);
  auto d_plen = B::up(prompt_len);
  auto d_hist = B::up(history);
  auto d_done = B::up(done);
  cpu::GreedyAdvanceArgs h;
  h.requests = requests;
  h.stop_stride = S;
  h.trash_page = trash;
  h.tokens = tokens.data();
  h.positions = positions.data();
  h.kv_len = kv_len.data();
  h.page_indptr = page_indptr.data();
  h.page_indices = page_indices.data();
  h.active = active.data();
  h.max_new = max_new.data();
  h.stop_ids = stop_ids.data();
  h.produced = produced.data();
  h.out = out.data();
  cpu::GreedyAdvanceArgs d = h;
  d.tokens = d_tokens.p();
  d.positions = d_pos.p();
  d.kv_len = d_kvl.p();
  d.page_indptr = d_pip.p();
  d.page_indices = d_pidx.p();
  d.active = d_act.p();
  d.max_new = d_max.p();
  d.stop_ids = d_stop.p();
  d.produced = d_prod.p();
  d.out = d_out.p();
  if (sampled) {
    h.draw = draw.data();
    h.output_len = output_len.data();
    h.prompt_len = prompt_len.data();
    h.history = history.data();
    h.history_stride = hist_stride;
    h.done = done.data();
    d.draw = d_draw.p();
    d.output_len = d_olen.p();
    d.prompt_len = d_plen.p();
    d.history = d_hist.p();
    d.history_stride = hist_stride;
    d.done = d_done.p();
  }
  for (int j = 0; j < K; ++j) {
    std::vector<int32_t> greedy(static_cast<size_t>(requests));
    for (int32_t& g : greedy) g = rng.integer(0, 20);  // hits the stop ids now and then
    auto d_greedy = B::up(greedy);
    h.greedy = greedy.data();
    d.greedy = d_greedy.p();
    B::greedy_advance(d, j);
    cpu::greedy_advance_cpu(h, j);
    const std::string at = std::string(sampled ? "greedy_advance (sampled)" : "greedy_advance") + ", step " +
                           std::to_string(j) + ": ";
    expect_equal(at + "tokens", B::down(d_tokens), tokens);
    expect_equal(at + "positions", B::down(d_pos), positions);
    expect_equal(at + "kv_len", B::down(d_kvl), kv_len);
    expect_equal(at + "page_indices", B::down(d_pidx), page_indices);
    expect_equal(at + "active", B::down(d_act), active);
    expect_equal(at + "produced", B::down(d_prod), produced);
    expect_equal(at + "out", B::down(d_out), out);
    expect_equal(at + "draw", B::down(d_draw), draw);
    expect_equal(at + "output_len", B::down(d_olen), output_len);
    expect_equal(at + "history", B::down(d_hist), history);
    expect_equal(at + "done", B::down(d_done), done);
  }
}


// The device speculative round's greedy acceptance (core/spec_accept.hpp) against its CPU
// reference, exactly. Drafts agree with the target's choice most of the time (p = 3/4 per
// position, so long accepted runs occur), the vocabulary is small (stop ids are hit inside
// accepted runs), max_new cuts some runs, some requests have no drafts.
template <class B>
void spec_accept_case(int requests, int N, uint64_t seed) {
  Rng rng(seed);
  const int S = 2;
  std::vector<int32_t> n(static_cast<size_t>(requests)), off(static_cast<size_t>(requests)), max_new(static_cast<size_t>(requests)), stop(static_cast<size_t>(requests * S)),
      drafts(static_cast<size_t>(requests * N), -7), target;
  for (int r = 0; r < requests; ++r) {
    n[size_t(r)] = rng.integer(0, 4) == 0 ? 0 : rng.integer(1, N);
    off[size_t(r)] = int32_t(target.size());
    for (int k = 0; k <= n[size_t(r)]; ++k) target.push_back(rng.integer(0, 30));
    for (int k = 0; k < n[size_t(r)]; ++k)
      drafts[size_t(r * N + k)] = rng.integer(0, 3) != 0 ? target[size_t(off[size_t(r)] + k)] : rng.integer(0, 30);
    max_new[size_t(r)] = rng.integer(1, N + 2);
    stop[size_t(r * S)] = rng.integer(0, 30);
    stop[size_t(r * S + 1)] = rng.integer(0, 2) ? rng.integer(0, 30) : -1;
  }
  std::vector<int32_t> out(static_cast<size_t>(requests * (N + 1)), kPoisonI32), count(static_cast<size_t>(requests), kPoisonI32),
      acc(static_cast<size_t>(requests), kPoisonI32), last(static_cast<size_t>(requests), kPoisonI32);
  auto d_n = B::up(n);
  auto d_off = B::up(off);
  auto d_max = B::up(max_new);
  auto d_stop = B::up(stop);
  auto d_drafts = B::up(drafts);
  auto d_target = B::up(target);
  auto d_out = B::up(out);
  auto d_count = B::up(count);
  auto d_acc = B::up(acc);
  auto d_last = B::up(last);
  cpu::SpecAcceptArgs h;
  h.requests = requests;
  h.max_drafts = N;
  h.stop_stride = S;
  h.drafts = drafts.data();
  h.num_drafts = n.data();
  h.verify_offset = off.data();
  h.target = target.data();
  h.max_new = max_new.data();
  h.stop_ids = stop.data();
  h.out = out.data();
  h.count = count.data();
  h.accepted = acc.data();
  h.last_row = last.data();
  cpu::SpecAcceptArgs d = h;
  d.drafts = d_drafts.p();
  d.num_drafts = d_n.p();
  d.verify_offset = d_off.p();
  d.target = d_target.p();
  d.max_new = d_max.p();
  d.stop_ids = d_stop.p();
  d.out = d_out.p();
  d.count = d_count.p();
  d.accepted = d_acc.p();
  d.last_row = d_last.p();
  B::spec_accept_greedy(d);
  cpu::spec_accept_greedy_cpu(h);
  expect_equal("spec_accept_greedy: out", B::down(d_out), out);
  expect_equal("spec_accept_greedy: count", B::down(d_count), count);
  expect_equal("spec_accept_greedy: accepted", B::down(d_acc), acc);
  expect_equal("spec_accept_greedy: last_row", B::down(d_last), last);
}

// copy_indexed_i32: indexed destination and source, negative indices skipped, against the loop.
template <class B>
void copy_indexed_case(int n, bool dst_indexed, bool src_indexed, uint64_t seed) {
  Rng rng(seed);
  const int m = 2 * n + 3;
  std::vector<int32_t> dst(static_cast<size_t>(m), kPoisonI32), src(static_cast<size_t>(m)), di(static_cast<size_t>(n)), si(static_cast<size_t>(n));
  for (auto& v : src) v = rng.integer(0, 1000);
  std::vector<int32_t> perm(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) perm[size_t(i)] = i;
  for (int i = m - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.integer(0, i))]);
  for (int i = 0; i < n; ++i) {
    di[size_t(i)] = rng.integer(0, 6) == 0 ? -1 : perm[size_t(i)];  // distinct destinations
    si[size_t(i)] = rng.integer(0, 6) == 0 ? -1 : rng.integer(0, m - 1);
  }
  auto d_dst = B::up(dst);
  auto d_src = B::up(src);
  auto d_di = B::up(di);
  auto d_si = B::up(si);
  B::copy_indexed_i32(d_dst.p(), dst_indexed ? d_di.p() : nullptr, d_src.p(), src_indexed ? d_si.p() : nullptr, n);
  for (int i = 0; i < n; ++i) {
    const int32_t d = dst_indexed ? di[size_t(i)] : i, q = src_indexed ? si[size_t(i)] : i;
    if (d >= 0 && q >= 0) dst[size_t(d)] = src[size_t(q)];
  }
  expect_equal("copy_indexed_i32", B::down(d_dst), dst);
}

}  // namespace fp4moe::test::ops

#include "ops/ops_cases_attention.hpp"
