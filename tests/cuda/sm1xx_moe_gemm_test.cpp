// The Blackwell NVFP4 grouped GEMMs (cuda/moe_gemm_sm1xx, CUTLASS block-scaled MMA) launched
// end to end against a CPU reference, on an sm_120 / sm_100 GPU: every instantiation built for
// the device's arch, every epilogue, irregular per-expert counts (empty experts, an expert
// crossing a 128-row SF atom), a sub-range of experts; outputs poisoned (every owned row
// written, rows of other experts untouched); per row ||y - ref|| / ||ref|| < 1e-2 (BF16 output
// of FP4 x FP4 products accumulated in FP32). COMPILED, NOT RUN: no Blackwell GPU has run it;
// on any other GPU, or without one, every test skips (ctest label `gpu`).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/moe_gemm_sm1xx/moe_gemm_sm1xx.hpp"
#include "format/fp4.hpp"
#include "gpu_test.hpp"
#include "moe_test_util.hpp"
#include "tuner/sm1xx_build.hpp"

namespace fp4moe::test {
namespace {

using cuda::ActFormat;
using cuda::Epilogue;
using cuda::MoeGemmArgs;
using cuda::MoeGemmDesc;
using cuda::Sm1xxConfig;

constexpr uint16_t kPoison = 0xFFFF;  // DeviceArray's fill: a NaN BF16

int device_cc() { return cuda::current_device().cc; }

#define SKIP_WITHOUT_BLACKWELL(cc)                                                                          \
  do {                                                                                                      \
    if ((cc) != 120 && (cc) != 100) GTEST_SKIP() << "needs an sm_120 / sm_100 GPU (this one: " << (cc) << ")"; \
    FP4MOE_SKIP_UNLESS_BUILT_FOR(cc);                                                                       \
    ASSERT_FALSE(cuda::sm1xx_configs(cc).empty()) << "built for sm_" << (cc) << "a but no kernel registered"; \
  } while (0)

// Experts quantized from random weights (quantize_nvfp4: the checkpoint's own codes / scales).
ExpertStack random_nvfp4_stack(int64_t E, int64_t N, int64_t K, uint64_t seed) {
  ExpertStack s;
  s.format = WeightFormat::NVFP4;
  s.num_experts = E;
  s.n = N;
  s.k = K;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<float> w = random_floats(size_t(N * K), seed + uint64_t(e), -0.05f, 0.05f);
    const Fp4Matrix q = quantize_nvfp4(w.data(), N, K);
    s.packed.insert(s.packed.end(), q.packed.begin(), q.packed.end());
    s.scales.insert(s.scales.end(), q.scales.begin(), q.scales.end());
    s.global_scale.push_back(q.global_scale);
  }
  return s;
}

struct Case {
  int64_t N = 256, K = 512;
  std::vector<int32_t> counts = {5, 0, 130, 1, 64, 17, 0, 40};
  Epilogue epilogue = Epilogue::None;
  int expert_begin = 0, expert_end = -1;
};

void run_case(const Case& c, const Sm1xxConfig& cfg, int cc) {
  const int64_t E = int64_t(c.counts.size()), N = c.N, K = c.K;
  std::vector<int32_t> off(size_t(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + c.counts[size_t(e)];
  const int64_t M = off.back();
  const int64_t out_n = c.epilogue == Epilogue::SiluMul ? N / 2 : N;
  const int begin = c.expert_begin, end = c.expert_end < 0 ? int(E) : c.expert_end;
  const int max_per_expert = *std::max_element(c.counts.begin(), c.counts.end());

  const ExpertStack stack = random_nvfp4_stack(E, N, K, 11 + uint64_t(N + K));
  std::vector<float> xf = random_floats(size_t(M * K), 21, -2.f, 2.f);
  for (float& v : xf) v = round_to_bf16(v);
  std::vector<uint16_t> xb(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) xb[i] = float_to_bf16(xf[i]);
  float amax = 0.f;
  for (float v : xf) amax = std::max(amax, std::fabs(v));
  const float g = nvfp4_global_scale_from_amax(amax);  // the static input_scale
  const std::vector<float> row_scale = random_floats(size_t(M), 31, 0.05f, 1.0f);

  MoeGemmDesc d;
  d.num_experts = int(E);
  d.n = int(N);
  d.k = int(K);
  d.max_tokens = int(M);
  d.weight = WeightFormat::NVFP4;
  d.act = ActFormat::NVFP4_EMULATED;
  d.epilogue = c.epilogue;
  ASSERT_EQ(cuda::sm1xx_can_implement(d, cfg, cc, max_per_expert), "");
  const int sms = cuda::current_device().sm_count;
  const cuda::DeviceBsWeights w = cuda::upload_weights_sm1xx(stack);
  DeviceArray<uint16_t> x(xb), y(size_t(M * out_n));
  DeviceArray<int32_t> doff(off);
  DeviceArray<float> dg(std::vector<float>{g}), drs(row_scale);
  DeviceArray<uint8_t> ws(size_t(cuda::sm1xx_workspace_layout(d, cfg, sms, max_per_expert).total));
  MoeGemmArgs a;
  a.x = x.ptr;
  a.expert_offsets = doff.ptr;
  a.row_scale = drs.ptr;
  a.y = y.ptr;
  a.m_total = int(M);
  a.workspace = ws.ptr;
  a.act_global_scale = dg.ptr;
  a.expert_begin = begin;
  a.expert_end = end;
  cuda::run_moe_gemm_sm1xx(d, cfg, w, a, max_per_expert);
  const std::vector<uint16_t> got = y.download();

  std::vector<float> wf(static_cast<size_t>(N * K)), xq(static_cast<size_t>(K)), acc(static_cast<size_t>(N));
  for (int64_t e = 0; e < E; ++e) {
    const bool mine = e >= begin && e < end;
    if (mine) dequantize_rows(stack.expert(e), 0, N, wf.data());
    for (int64_t m = off[size_t(e)]; m < off[size_t(e) + 1]; ++m) {
      SCOPED_TRACE(cfg.name() + " expert " + std::to_string(e) + " row " + std::to_string(m));
      if (!mine) {
        for (int64_t j = 0; j < out_n; ++j) ASSERT_EQ(got[size_t(m * out_n + j)], kPoison) << "written by another call's expert";
        continue;
      }
      const Fp4Matrix q = quantize_nvfp4(xf.data() + m * K, 1, K, g);
      dequantize_rows(q.view(), 0, 1, xq.data());
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(xq[size_t(k)]) * double(wf[size_t(n * K + k)]);
        acc[size_t(n)] = float(s);
      }
      std::vector<float> ref(static_cast<size_t>(out_n)), out(static_cast<size_t>(out_n));
      for (int64_t j = 0; j < out_n; ++j) {
        const float v = acc[size_t(j)];
        ref[size_t(j)] = c.epilogue == Epilogue::SiluMul ? v / (1.0f + std::exp(-v)) * acc[size_t(N / 2 + j)]
                         : c.epilogue == Epilogue::RowScale ? v * row_scale[size_t(m)]
                                                            : v;
        ASSERT_NE(got[size_t(m * out_n + j)], kPoison) << "column " << j << " not written";
        out[size_t(j)] = bf16_to_float(got[size_t(m * out_n + j)]);
      }
      ASSERT_LT(rel_error(out.data(), ref.data(), size_t(out_n)), 1e-2);
    }
  }
}

TEST(Sm1xxMoeGemm, EveryBuiltConfigAndEpilogueMatchesTheCpuReferencePerRow) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int cc = device_cc();
  SKIP_WITHOUT_BLACKWELL(cc);
  for (const Sm1xxConfig& cfg : cuda::sm1xx_configs(cc))
    for (Epilogue ep : {Epilogue::None, Epilogue::SiluMul, Epilogue::RowScale}) {
      Case c;
      c.epilogue = ep;
      run_case(c, cfg, cc);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(Sm1xxMoeGemm, ASubRangeOfExpertsLeavesTheOthersUntouched) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int cc = device_cc();
  SKIP_WITHOUT_BLACKWELL(cc);
  for (const Sm1xxConfig& cfg : cuda::sm1xx_configs(cc)) {
    Case c;
    c.expert_begin = 2;
    c.expert_end = 6;
    run_case(c, cfg, cc);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Sm1xxMoeGemm, Glm5ShapesDecodeBatch) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int cc = device_cc();
  SKIP_WITHOUT_BLACKWELL(cc);
  for (const Sm1xxConfig& cfg : cuda::sm1xx_configs(cc)) {
    Case c;  // GLM-5 down projection: N 6144, K 2048; a decode batch of 8 tokens x top-8 over 16 experts
    c.N = 6144;
    c.K = 2048;
    c.counts = {4, 0, 9, 3, 0, 7, 5, 2, 8, 0, 6, 4, 3, 0, 8, 5};
    c.epilogue = Epilogue::RowScale;
    run_case(c, cfg, cc);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace fp4moe::test
