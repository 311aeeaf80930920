// cuda/linear (the dense linear op) on the GPU against the CPU linear (cpu/linear_cpu.hpp), per
// weight format and shape: NVFP4 / MXFP4 on the sm_90a kernels (N % 128 == 0, K % 64 == 0) and
// on Generic (kv_a_proj's N = 576, K = 96), FP4 dequantized to BF16 at load (bf16_only callers:
// FP32 outputs, strided rows), BF16 and F32 (rounded at load) on cuBLASLt. Random inputs, outputs
// poisoned before the call, every row compared on its own; rows past T and the strides' gaps
// must stay poison. The kernel each row runs is what choose_linear_kernel says for this GPU
// (checked), so on an H100 / H200 the FP4 rows cover both FP4 kernels. Skips without a GPU.
// LinearBoundModel (no GPU, runs in CI) puts CPU models of what each kernel computes (other
// accumulation order, the FP4 global applied last, the load-time BF16 copy, BF16 outputs)
// through the same comparison: they pass, and a result off by 2× fails every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "cpu/linear_cpu.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/staged_upload.hpp"
#include "cuda/linear/linear.hpp"
#include "cuda/linear_fp4_gemm_check.hpp"
#include "gpu_test.hpp"
#include "ops/ops_util.hpp"

namespace fp4moe::test::ops {
namespace {

using cpu::LinearFormat;
using cuda::linear::LinearKernel;

struct LinearRow {
  LinearFormat format = LinearFormat::BF16;
  int64_t n = 0, k = 0;
  std::vector<int> tokens;  // one call per entry, on the same upload
  bool bf16_only = false;
  bool y_f32 = false;       // cuBLASLt rows only
  int pad_x = 0, pad_y = 0; // row-stride padding (cuBLASLt rows only)
  uint64_t seed = 1;
};

// Every row of the table (the GPU test and the CPU model test run the same).
std::vector<LinearRow> linear_rows() {
  return {
      // FP4 on the sm_90a tiles (on an H100 / H200): tokens buckets of the decode and wgmma kernels.
      {LinearFormat::NVFP4, 256, 512, {1, 7, 64, 300}, false, false, 0, 0, 1},
      {LinearFormat::MXFP4, 384, 1024, {1, 33}, false, false, 0, 0, 2},
      // FP4 on Generic: N off the 128-row tile (kv_a_proj_with_mqa's 576), K off the 64-wide stage.
      {LinearFormat::NVFP4, 576, 1024, {1, 20}, false, false, 0, 0, 3},
      {LinearFormat::MXFP4, 200, 96, {5}, false, false, 0, 0, 4},
      // FP4 dequantized at load for bf16_only callers (lm_head-like: FP32 rows, strided).
      {LinearFormat::NVFP4, 256, 512, {9}, true, true, 8, 5, 5},
      {LinearFormat::MXFP4, 130, 64, {1, 4}, true, false, 0, 0, 6},
      // BF16 and F32 (rounded at load) on cuBLASLt.
      {LinearFormat::BF16, 320, 256, {1, 17}, false, false, 0, 0, 7},
      {LinearFormat::BF16, 96, 192, {3}, false, true, 0, 4, 8},
      {LinearFormat::F32, 130, 64, {3}, false, false, 0, 0, 9},
  };
}

std::string row_name(const LinearRow& r);
void PrintTo(const LinearRow& r, std::ostream* os) { *os << row_name(r); }  // gtest's parameter line

std::string test_name(const LinearRow& r) {
  return std::string(cpu::linear_format_name(r.format)) + "_" + std::to_string(r.n) + "x" + std::to_string(r.k) +
         (r.bf16_only ? "_bf16_only" : "") + (r.y_f32 ? "_f32_out" : "") + (r.pad_x || r.pad_y ? "_strided" : "");
}

std::string row_name(const LinearRow& r) {
  return std::string(cpu::linear_format_name(r.format)) + " [" + std::to_string(r.n) + " x " + std::to_string(r.k) +
         "]" + (r.bf16_only ? " bf16_only" : "") + (r.y_f32 ? " f32 out" : "") +
         (r.pad_x || r.pad_y ? " strided" : "");
}

// The weight of a row: FP4 codes and scales as random as the GEMM tests' (linear_fp4_gemm_check),
// BF16 / F32 uniform in ±1/√k (so outputs are O(1)).
struct Weight {
  ExpertStack fp4;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  cpu::LinearView view;
};

Weight make_weight(const LinearRow& r, std::mt19937_64& rng) {
  Weight w;
  cpu::LinearView& v = w.view;
  v.format = r.format;
  v.n = r.n;
  v.k = r.k;
  const float a = 1.0f / std::sqrt(float(r.k));
  std::uniform_real_distribution<float> u(-a, a);
  switch (r.format) {
    case LinearFormat::NVFP4:
    case LinearFormat::MXFP4:
      w.fp4 = random_expert_stack(r.format == LinearFormat::MXFP4 ? WeightFormat::MXFP4 : WeightFormat::NVFP4, 1,
                                  int(r.n), int(r.k), rng);
      v.packed = w.fp4.packed.data();
      v.scales = w.fp4.scales.data();
      v.global_scale = w.fp4.global_scale[0];
      break;
    case LinearFormat::BF16:
      w.bf16.resize(size_t(r.n * r.k));
      for (uint16_t& x : w.bf16) x = float_to_bf16(u(rng));
      v.data = w.bf16.data();
      break;
    case LinearFormat::F32:
      w.f32.resize(size_t(r.n * r.k));
      for (float& x : w.f32) x = u(rng);
      v.data = w.f32.data();
      break;
  }
  return w;
}

// Per output element j of a row, with a_j = Σ_i |x_i · w_ji| (W as the checkpoint holds it):
//   - both sides accumulate K FP32 products in their own order: ≤ 2 · K · 2^-24 · a_j;
//   - the FP4 kernels decode code × block scale exactly in BF16 (≤ 6 significant bits) and apply
//     the global in FP32: one more 2^-24 · a_j; a weight converted to BF16 at load (FP4
//     dequantized incl. its global, or F32) moves each product by ≤ 2^-9: 2^-9 · a_j;
//   - a BF16 output is rounded once: 2^-9 · |ref_j|.
// The row's bound is 2 × the L2 norm of these per-element bounds (|err_j| ≤ e_j for every j).
// Returns one line per row outside it (or with a NaN).
std::vector<std::string> rows_outside_bound(const LinearRow& r, const Weight& w, bool converted, int T,
                                            const std::vector<uint16_t>& x, int64_t ldx, const std::vector<float>& got,
                                            int64_t ldy) {
  const std::vector<float> xf = widen(x);
  std::vector<float> ref(size_t(T) * r.n);
  cpu::linear_strided_cpu(w.view, xf.data(), ldx, T, ref.data(), r.n, 1);
  std::vector<float> wrow(size_t(r.k));
  std::vector<double> abs_dot(size_t(T) * r.n, 0.0);  // a_j per (t, j)
  for (int64_t j = 0; j < r.n; ++j) {
    cpu::linear_row_cpu(w.view, j, wrow.data());
    for (int t = 0; t < T; ++t) {
      double s = 0.0;
      for (int64_t i = 0; i < r.k; ++i) s += std::abs(double(xf[size_t(t * ldx + i)]) * wrow[size_t(i)]);
      abs_dot[size_t(t * r.n + j)] = s;
    }
  }
  converted = converted && r.format != LinearFormat::BF16;
  const double per_a = 2.0 * double(r.k) * kF32Rel + kF32Rel + (converted ? kBf16Rel : 0.0);
  const double per_y = r.y_f32 ? 0.0 : kBf16Rel;
  std::vector<std::string> out;
  for (int t = 0; t < T; ++t) {
    double e2 = 0.0, err = 0.0, norm = 0.0;
    bool nan = false;
    for (int64_t j = 0; j < r.n; ++j) {
      const double f = ref[size_t(t * r.n + j)], g = got[size_t(t * ldy + j)];
      const double e = per_a * abs_dot[size_t(t * r.n + j)] + per_y * std::abs(f);
      e2 += e * e;
      nan = nan || std::isnan(g);
      err += (g - f) * (g - f);
      norm += f * f;
    }
    const double bound = 2.0 * std::sqrt(e2);
    err = std::sqrt(err);
    if (nan || !(err <= bound))
      out.push_back("row " + std::to_string(t) + (nan ? " has NaN (poison left or produced)" : "") + ": |got - ref| " +
                    std::to_string(err) + " > bound " + std::to_string(bound) + " (|ref| " +
                    std::to_string(std::sqrt(norm)) + ")");
  }
  return out;
}

void expect_within_bound(const LinearRow& r, const Weight& w, bool converted, int T, const std::vector<uint16_t>& x,
                         int64_t ldx, const std::vector<float>& got, int64_t ldy, const std::string& what) {
  const std::vector<std::string> bad = rows_outside_bound(r, w, converted, T, x, ldx, got, ldy);
  for (size_t i = 0; i < std::min<size_t>(bad.size(), 5); ++i) ADD_FAILURE() << what << " T=" << T << ": " << bad[i];
}

void run_row(const LinearRow& r) {
  SCOPED_TRACE(row_name(r));
  std::mt19937_64 rng(r.seed);
  const Weight w = make_weight(r, rng);
  const int max_t = *std::max_element(r.tokens.begin(), r.tokens.end());
  cuda::StagedUpload staging(2);
  cuda::linear::Linear lin(w.view, "test." + row_name(r), max_t, r.bf16_only, staging);
  staging.finish();
  // The op runs what the choice says for this GPU.
  cuda::linear::LinearDesc d;
  d.format = r.format;
  d.n = r.n;
  d.k = r.k;
  d.max_tokens = max_t;
  d.bf16_only = r.bf16_only;
  const cuda::linear::LinearChoice want = cuda::linear::choose_linear_kernel(d, cuda::current_device().cc);
  ASSERT_EQ(lin.kernel(), want.kernel) << lin.describe() << " / " << want.why;
  ASSERT_EQ(lin.choice().converted, want.converted);
  ASSERT_EQ(lin.n, r.n);
  ASSERT_EQ(lin.k, r.k);

  cuda::linear::Blas blas;
  cuda::DeviceBuffer ws(std::max<size_t>(lin.fp4_workspace_bytes(), 256));
  const int64_t ldx = r.k + r.pad_x, ldy = r.n + r.pad_y;
  const int extra = 2;  // rows past T: must stay poison
  for (int T : r.tokens) {
    SCOPED_TRACE("T = " + std::to_string(T));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<uint16_t> x(size_t(T) * ldx);
    for (uint16_t& v : x) v = float_to_bf16(g(rng));
    const std::vector<int32_t> offsets = {0, T};
    cuda::DeviceBuffer dx = cuda::DeviceBuffer::from(x), doff = cuda::DeviceBuffer::from(offsets);
    const size_t ys = size_t(T + extra) * size_t(ldy);
    cuda::DeviceBuffer dy = r.y_f32 ? cuda::DeviceBuffer::from(std::vector<float>(ys, kPoisonF32))
                                    : cuda::DeviceBuffer::from(std::vector<uint16_t>(ys, kPoisonBf16));
    const cuda::linear::LinearCtx ctx{&blas, doff.as<int32_t>(), ws.ptr(), nullptr};
    lin.run(dx.as<uint16_t>(), T, dy.ptr(), r.y_f32, ctx, r.pad_x ? ldx : 0, r.pad_y ? ldy : 0);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(ys);
    if (r.y_f32) {
      got = dy.download<float>(ys);
    } else {
      const std::vector<uint16_t> g16 = dy.download<uint16_t>(ys);
      for (size_t i = 0; i < ys; ++i) got[i] = bf16_to_float(g16[i]);
    }
    expect_within_bound(r, w, lin.choice().converted, T, x, ldx, got, ldy, row_name(r) + " on " + lin.describe());
    for (int64_t t = 0; t < T + extra; ++t)
      for (int64_t j = t < T ? r.n : 0; j < ldy; ++j)
        ASSERT_TRUE(std::isnan(got[size_t(t * ldy + j)])) << "wrote past its rows / columns: row " << t << " col " << j;
  }
}

class LinearOpsGpu : public ::testing::TestWithParam<LinearRow> {};

TEST_P(LinearOpsGpu, MatchesTheCpuLinear) {
  FP4MOE_SKIP_WITHOUT_GPU();
  run_row(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Rows, LinearOpsGpu, ::testing::ValuesIn(linear_rows()),
                         [](const ::testing::TestParamInfo<LinearRow>& i) { return test_name(i.param); });

// What the kernels compute, on the CPU: the FP4 kernels multiply x by the exact BF16 code × block
// scale, accumulate in FP32 (here in reverse order) and apply the global last; the converted path
// multiplies by the load-time BF16 copy (linear_to_bf16); BF16 outputs are rounded once. `factor`
// scales the result (2: a wrong global scale).
std::vector<float> kernel_model(const LinearRow& r, const Weight& w, bool converted, int T,
                                const std::vector<uint16_t>& x, int64_t ldx, int64_t ldy, float factor) {
  std::vector<float> wm(size_t(r.n * r.k));
  float global = 1.0f;
  if (converted) {
    wm = widen(cuda::linear::linear_to_bf16(w.view));
  } else {
    cpu::LinearView v = w.view;
    if (v.is_fp4()) {
      global = v.global_scale;
      v.global_scale = 1.0f;
    }
    for (int64_t j = 0; j < r.n; ++j) cpu::linear_row_cpu(v, j, wm.data() + j * r.k);
  }
  std::vector<float> y(size_t(T) * size_t(ldy), kPoisonF32);
  for (int t = 0; t < T; ++t)
    for (int64_t j = 0; j < r.n; ++j) {
      float acc = 0.0f;
      for (int64_t i = r.k - 1; i >= 0; --i) acc += bf16_to_float(x[size_t(t * ldx + i)]) * wm[size_t(j * r.k + i)];
      const float v = acc * global * factor;
      y[size_t(t * ldy + j)] = r.y_f32 ? v : bf16_to_float(float_to_bf16(v));
    }
  return y;
}

class LinearBoundModel : public ::testing::TestWithParam<LinearRow> {};

TEST_P(LinearBoundModel, KernelModelsPassAndAResultOffByTwoFails) {
  const LinearRow& r = GetParam();
  std::mt19937_64 rng(r.seed);
  const Weight w = make_weight(r, rng);
  cuda::linear::LinearDesc d;
  d.format = r.format;
  d.n = r.n;
  d.k = r.k;
  d.max_tokens = *std::max_element(r.tokens.begin(), r.tokens.end());
  d.bf16_only = r.bf16_only;
  const bool converted = cuda::linear::choose_linear_kernel(d, 90).converted;  // the H100 / H200 choice
  const int64_t ldx = r.k + r.pad_x, ldy = r.n + r.pad_y;
  for (int T : r.tokens) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<uint16_t> x(size_t(T) * ldx);
    for (uint16_t& v : x) v = float_to_bf16(g(rng));
    expect_within_bound(r, w, converted, T, x, ldx, kernel_model(r, w, converted, T, x, ldx, ldy, 1.0f), ldy,
                        row_name(r) + " (CPU model)");
    const std::vector<std::string> bad =
        rows_outside_bound(r, w, converted, T, x, ldx, kernel_model(r, w, converted, T, x, ldx, ldy, 2.0f), ldy);
    EXPECT_EQ(bad.size(), size_t(T)) << row_name(r) << ": a result off by 2x passed some rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, LinearBoundModel, ::testing::ValuesIn(linear_rows()),
                         [](const ::testing::TestParamInfo<LinearRow>& i) { return test_name(i.param); });

}  // namespace
}  // namespace fp4moe::test::ops
