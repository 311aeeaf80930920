// GPU router vs the CPU reference (cpu/moe_cpu.hpp route_cpu): the fused selection kernel
// on identical logits must give identical top-k ids (same tie rule: higher biased score
// first, equal -> lower expert id), weights within float rounding; the FP32 logits GEMM
// against a double reference.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "cpu/moe_cpu.hpp"
#include "cuda/routing/router.hpp"
#include "moe_test_util.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;

MoeConfig make_cfg(int64_t E, int64_t k, int64_t n_group, int64_t topk_group, ScoringFunc sf, bool norm,
                   float scaling) {
  MoeConfig c;
  c.hidden = 64;
  c.inter = 32;
  c.num_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.scoring = sf;
  c.norm_topk_prob = norm;
  c.routed_scaling = scaling;
  return c;
}

void expect_same_routing(const MoeConfig& c, const std::vector<float>& logits, const std::vector<float>& bias,
                         int64_t T) {
  DeviceArray<float> d_logits(logits), d_w(size_t(T * c.top_k));
  DeviceArray<int32_t> d_ids(size_t(T * c.top_k));
  std::unique_ptr<DeviceArray<float>> d_bias;
  if (!bias.empty()) d_bias = std::make_unique<DeviceArray<float>>(bias);
  cuda::route_topk(cuda::router_desc_from(c), d_logits.ptr, d_bias ? d_bias->ptr : nullptr, int(T), d_ids.ptr,
                   d_w.ptr, nullptr);
  const std::vector<int32_t> ids = d_ids.download();
  const std::vector<float> w = d_w.download();
  const RoutingResult ref = route_cpu(c, logits.data(), bias.empty() ? nullptr : bias.data(), T);
  int64_t id_mismatch = 0;
  for (size_t i = 0; i < ids.size(); ++i) id_mismatch += ids[i] != ref.topk_ids[i];
  EXPECT_EQ(id_mismatch, 0) << "of " << ids.size() << " slots";
  EXPECT_LT(test::rel_error(w.data(), ref.topk_weights.data(), w.size()), 1e-5);
}

struct RouteCase {
  const char* name;
  int64_t E, k, n_group, topk_group;
  ScoringFunc sf;
  bool norm, bias;
  float scaling;
};

class RouterTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouterTest, MatchesCpuOnRandomLogits) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const RouteCase rc = GetParam();
  const MoeConfig c = make_cfg(rc.E, rc.k, rc.n_group, rc.topk_group, rc.sf, rc.norm, rc.scaling);
  for (int64_t T : {1, 37, 1000}) {
    const auto logits = test::random_floats(size_t(T * rc.E), 17 + T, -4.f, 4.f);
    const auto bias = rc.bias ? test::random_floats(size_t(rc.E), 5, -0.1f, 0.1f) : std::vector<float>{};
    SCOPED_TRACE(::testing::Message() << rc.name << " T=" << T);
    expect_same_routing(c, logits, bias, T);
  }
}

TEST_P(RouterTest, TiesBreakToLowerExpertId) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const RouteCase rc = GetParam();
  const MoeConfig c = make_cfg(rc.E, rc.k, rc.n_group, rc.topk_group, rc.sf, rc.norm, rc.scaling);
  const int64_t T = 300;
  // Logits from 3 values: nearly every selection is a tie (whole groups tie as well).
  std::vector<float> logits = test::random_floats(size_t(T * rc.E), 99);
  for (float& v : logits) v = v < -0.3f ? -1.f : (v < 0.4f ? 0.f : 1.f);
  // Token 0: all equal -> the first k eligible experts in id order.
  for (int64_t e = 0; e < rc.E; ++e) logits[size_t(e)] = 0.5f;
  std::vector<float> bias;
  if (rc.bias) bias.assign(size_t(rc.E), 0.25f);  // equal bias keeps the ties
  expect_same_routing(c, logits, bias, T);
  if (rc.n_group == 1) {
    DeviceArray<float> d_logits(logits), d_w(size_t(T * c.top_k));
    DeviceArray<int32_t> d_ids(size_t(T * c.top_k));
    cuda::route_topk(cuda::router_desc_from(c), d_logits.ptr, nullptr, int(T), d_ids.ptr, d_w.ptr, nullptr);
    const auto ids = d_ids.download();
    for (int64_t s = 0; s < rc.k; ++s) EXPECT_EQ(ids[size_t(s)], s);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, RouterTest,
    ::testing::Values(RouteCase{"glm5", 256, 8, 1, 1, ScoringFunc::Sigmoid, true, true, 2.5f},
                      RouteCase{"deepseek_v3", 256, 8, 8, 4, ScoringFunc::Sigmoid, true, true, 2.5f},
                      RouteCase{"qwen3", 128, 8, 1, 1, ScoringFunc::Softmax, true, false, 1.0f},
                      RouteCase{"qwen3_nonorm", 128, 8, 1, 1, ScoringFunc::Softmax, false, false, 1.0f},
                      RouteCase{"mixtral", 8, 2, 1, 1, ScoringFunc::Softmax, true, false, 1.0f},
                      RouteCase{"grouped_small", 16, 4, 4, 2, ScoringFunc::Sigmoid, true, true, 1.5f},
                      RouteCase{"top1", 16, 1, 1, 1, ScoringFunc::Sigmoid, false, true, 1.0f}),
    [](const ::testing::TestParamInfo<RouteCase>& i) { return std::string(i.param.name); });

TEST(RouterLogits, Fp32GemmMatchesDoubleReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int T = 33, H = 6144, E = 256;
  const auto x = test::random_floats(size_t(T) * H, 1), w = test::random_floats(size_t(E) * H, 2, -0.02f, 0.02f);
  DeviceArray<float> dx(x), dw(w), dl(size_t(T) * E);
  cublasHandle_t h;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
  cuda::router_logits_f32(h, dx.ptr, dw.ptr, dl.ptr, T, H, E, nullptr);
  const auto l = dl.download();
  cublasDestroy(h);
  std::vector<float> ref(size_t(T) * E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int i = 0; i < H; ++i) s += double(x[size_t(t) * H + i]) * double(w[size_t(e) * H + i]);
      ref[size_t(t) * E + e] = float(s);
    }
  EXPECT_LT(test::rel_error(l.data(), ref.data(), ref.size()), 1e-5);
}

TEST(RouterLogits, Bf16ToF32IsExact) {
  FP4MOE_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> h(1000);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(0x3c00 + i * 37);
  DeviceArray<uint16_t> d(h);
  DeviceArray<float> f(h.size());
  cuda::bf16_to_f32(d.ptr, f.ptr, int64_t(h.size()), nullptr);
  const auto out = f.download();
  // The patterns sweep 0x3c00.. past 0x7f80 into NaNs: compare bits, so NaN payloads count too.
  for (size_t i = 0; i < h.size(); ++i) {
    uint32_t got;
    std::memcpy(&got, &out[i], 4);
    ASSERT_EQ(got, uint32_t(h[i]) << 16) << "bf16 pattern 0x" << std::hex << h[i];
  }
}

TEST(RouterDesc, RejectsUnsupportedConfigs) {
  cuda::RouterDesc d;
  d.num_experts = 2048;
  d.top_k = 8;
  EXPECT_THROW(cuda::check_router_desc(d), Error);
  d.num_experts = 256;
  d.top_k = 64;
  EXPECT_THROW(cuda::check_router_desc(d), Error);
  d.top_k = 8;
  d.n_group = 3;  // 256 % 3 != 0
  EXPECT_THROW(cuda::check_router_desc(d), Error);
  d.n_group = 8;
  d.topk_group = 9;
  EXPECT_THROW(cuda::check_router_desc(d), Error);
  d.topk_group = 4;
  EXPECT_NO_THROW(cuda::check_router_desc(d));
}

}  // namespace
}  // namespace fp4moe
