// The Generic FP4 GEMM kernel (cuda/moe_gemm/generic_nvfp4_grouped_gemm_kernels.cuh) on the CPU
// through the CUDA emulator (tests/cuda/emu), against the CPU linear (cpu/linear_cpu.hpp): the
// E = 1 case cuda/linear runs for the dense FP4 linears the sm_90a tiles do not take (N off the
// 128-row tile, K off the 64-wide stage, any arch), and a grouped call (an expert without rows).
// Random codes and scales (incl. subnormal and zero E4M3 scales), outputs poisoned, every row
// compared on its own within the bound linear_ops_test derives; rows past the offsets untouched.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm_kernels.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "cpu/linear_cpu.hpp"
#include "ops/ops_util.hpp"
#include "random_fp4.hpp"

namespace fp4moe::test::ops {
namespace {

namespace lf = fp4moe::cuda::linear_fp4;

struct GenericRow {
  WeightFormat format = WeightFormat::NVFP4;
  int n = 0, k = 0;
  std::vector<int> rows;  // rows per expert (E = rows.size())
  uint64_t seed = 1;
};

std::string row_name(const GenericRow& r) {
  std::string s(weight_format_name(r.format));
  s += " [" + std::to_string(r.n) + " x " + std::to_string(r.k) + "] rows";
  for (int m : r.rows) {
    s += ' ';
    s += std::to_string(m);
  }
  return s;
}

cpu::LinearView expert_view(const ExpertStack& s, int e) {
  cpu::LinearView v;
  v.format = s.format == WeightFormat::MXFP4 ? cpu::LinearFormat::MXFP4 : cpu::LinearFormat::NVFP4;
  v.n = s.n;
  v.k = s.k;
  v.packed = s.packed.data() + size_t(e) * size_t(s.n * s.k / 2);
  v.scales = s.scales.data() + size_t(e) * size_t(s.n * (s.k / s.block()));
  v.global_scale = s.global_scale[size_t(e)];
  return v;
}

void run_row(const GenericRow& r) {
  SCOPED_TRACE(row_name(r));
  const int E = int(r.rows.size());
  const ExpertStack w = random_stack(r.format, E, r.n, r.k, r.seed);
  std::vector<int32_t> offsets = {0};
  for (int m : r.rows) offsets.push_back(offsets.back() + m);
  const int M = offsets.back(), extra = 3;  // rows past the last expert's: must stay poison
  Rng rng(r.seed + 100);
  const std::vector<uint16_t> x = rand_bf16(rng, size_t(M + extra) * r.k, -2.0f, 2.0f);
  std::vector<uint16_t> y(size_t(M + extra) * r.n, kPoisonBf16);

  lf::GenericParams p;
  p.x = x.data();
  p.offsets = offsets.data();
  p.packed = w.packed.data();
  p.scales = w.scales.data();
  p.global = w.global_scale.data();
  p.y = y.data();
  p.num_experts = E;
  p.n = r.n;
  p.k = r.k;
  p.n_out = r.n;
  p.epilogue = lf::kEpiNone;
  p.mx = r.format == WeightFormat::MXFP4;
  const dim3 grid(unsigned((r.n + lf::kGenericRowsW - 1) / lf::kGenericRowsW), unsigned(E));
  if (p.mx)
    emu::launch(grid, dim3(128), 0, lf::generic_fp4_grouped_gemm_kernel<true>, p);
  else
    emu::launch(grid, dim3(128), 0, lf::generic_fp4_grouped_gemm_kernel<false>, p);

  // Per output element, a_j = Σ_i |x_i · w_ji|: the emulated mma sums exact BF16 products in
  // FP32 in its own order (≤ K · 2^-24 · a_j from exact, as the reference: 2 · K · 2^-24 · a_j
  // apart), the global in FP32 (2^-24 · a_j), the BF16 output (2^-9 · |ref_j|); bound = 2 × the
  // L2 norm of these over the row.
  const std::vector<float> xf = widen(x), yf = widen(y);
  std::vector<float> wrow(size_t(r.k));
  for (int e = 0; e < E; ++e) {
    const cpu::LinearView v = expert_view(w, e);
    const int m0 = offsets[size_t(e)], rows = r.rows[size_t(e)];
    if (rows == 0) continue;
    std::vector<float> ref(size_t(rows) * r.n);
    cpu::linear_strided_cpu(v, xf.data() + size_t(m0) * r.k, r.k, rows, ref.data(), r.n, 1);
    std::vector<double> abs_dot(size_t(rows) * r.n);
    for (int j = 0; j < r.n; ++j) {
      cpu::linear_row_cpu(v, j, wrow.data());
      for (int t = 0; t < rows; ++t) {
        double s = 0.0;
        for (int i = 0; i < r.k; ++i) s += std::abs(double(xf[size_t((m0 + t) * r.k + i)]) * wrow[size_t(i)]);
        abs_dot[size_t(t * r.n + j)] = s;
      }
    }
    const std::vector<float> got(yf.begin() + int64_t(m0) * r.n, yf.begin() + int64_t(m0 + rows) * r.n);
    const double per_a = (2.0 * r.k + 1.0) * kF32Rel;
    expect_rows_close("generic " + row_name(r) + " expert " + std::to_string(e), got, r.n, ref, rows, r.n,
                      [&](int64_t t, double) {
                        double e2 = 0.0;
                        for (int j = 0; j < r.n; ++j) {
                          const double b = per_a * abs_dot[size_t(t * r.n + j)] +
                                           kBf16Rel * std::abs(ref[size_t(t * r.n + j)]);
                          e2 += b * b;
                        }
                        return 2.0 * std::sqrt(e2);
                      });
  }
  for (size_t i = size_t(M) * r.n; i < y.size(); ++i) ASSERT_EQ(y[i], kPoisonBf16) << "wrote past the offsets: " << i;
}

// E = 1 (cuda/linear's Fp4Generic): N off the 128-row tile with a partial second tile, K off the
// 64-wide stage (a partial last K step), token tiles of 32 crossed.
TEST(GenericFp4GemmEmu, DenseLinearsMatchTheCpuLinear) {
  run_row({WeightFormat::NVFP4, 200, 96, {5}, 1});
  run_row({WeightFormat::MXFP4, 130, 64, {3}, 2});
  run_row({WeightFormat::NVFP4, 144, 128, {33}, 3});
  run_row({WeightFormat::MXFP4, 72, 160, {1}, 4});
}

// The grouped call the MoE fallback makes: an expert without rows, experts of 1 and 2 rows.
TEST(GenericFp4GemmEmu, GroupedExpertsMatchTheCpuLinear) { run_row({WeightFormat::NVFP4, 136, 64, {2, 0, 1}, 5}); }

}  // namespace
}  // namespace fp4moe::test::ops
