// cuda::route (BF16 x -> FP32 logits -> top-k) against the CPU, on both paths (FusedGemv,
// TiledGemm) and the automatic choice, T crossing the path switch, with poisoned outputs:
//   logits:  against a double reference, |gpu - ref| <= 1e-5 Σ|x w| per logit and ‖·‖-relative < 1e-5;
//   ids:     route_cpu run on the GPU's own logits must give IDENTICAL ids (weights rel < 1e-5);
//   ties:    route_cpu on the double reference logits must give identical ordered ids on every
//            token whose ranking is decided by more than a margin (every adjacent gap of the
//            first k+1 eligible experts, and the group cut), and >= 90 % of tokens must be
//            decided (a different FP32 summation order may only move true near-ties).
// Plus: graph capture + replay == eager (bitwise), run-twice determinism and the counters
// left at 0, bad inputs. DISABLED_*Perf* times the router alone (new vs the old three steps).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/moe_cpu.hpp"
#include "cuda/routing/router.hpp"
#include "moe/random_layer.hpp"
#include "moe_test_util.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;
using cuda::RouterPath;

struct Case {
  const char* name;
  int64_t E, k, n_group, topk_group;
  ScoringFunc sf;
  bool norm, bias;
  float scaling;
};

MoeConfig cfg_of(const Case& rc, int64_t H) {
  MoeConfig c;
  c.hidden = H;
  c.inter = 32;
  c.num_experts = rc.E;
  c.top_k = rc.k;
  c.n_group = rc.n_group;
  c.topk_group = rc.topk_group;
  c.scoring = rc.sf;
  c.norm_topk_prob = rc.norm;
  c.routed_scaling = rc.scaling;
  return c;
}

// Host inputs: x as BF16 bits (and the same values as float), W, bias.
struct Inputs {
  int64_t T = 0, H = 0, E = 0;
  std::vector<uint16_t> x;
  std::vector<float> xf, w, bias;
};

Inputs make_inputs(int64_t T, int64_t H, int64_t E, bool bias, uint64_t seed) {
  Inputs in;
  in.T = T, in.H = H, in.E = E;
  const std::vector<float> xr = test::random_floats(size_t(T * H), seed, -1.f, 1.f);
  in.x.resize(xr.size());
  in.xf.resize(xr.size());
  for (size_t i = 0; i < xr.size(); ++i) {
    in.x[i] = float_to_bf16(xr[i]);
    in.xf[i] = bf16_to_float(in.x[i]);
  }
  in.w = test::random_floats(size_t(E * H), seed + 1, -0.05f, 0.05f);
  if (bias) in.bias = test::random_floats(size_t(E), seed + 2, -0.1f, 0.1f);
  return in;
}

// Double reference logits and Σ|x w| per logit.
void reference_logits(const Inputs& in, std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(size_t(in.T * in.E), 0.0);
  mag.assign(size_t(in.T * in.E), 0.0);
  parallel_for(in.T, default_num_threads(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t e = 0; e < in.E; ++e) {
        double s = 0, m = 0;
        const float* xr = in.xf.data() + t * in.H;
        const float* wr = in.w.data() + e * in.H;
        for (int64_t i = 0; i < in.H; ++i) {
          const double p = double(xr[i]) * double(wr[i]);
          s += p;
          m += std::fabs(p);
        }
        ref[size_t(t * in.E + e)] = s;
        mag[size_t(t * in.E + e)] = m;
      }
  });
}

// Is token t's ordered top-k decided by more than a margin in the exact (double) scores?
bool decided(const MoeConfig& c, const double* logit, const float* bias) {
  const int64_t E = c.num_experts;
  std::vector<double> sel(static_cast<size_t>(E));
  double mx = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logit[e]);
  for (int64_t e = 0; e < E; ++e) sum += std::exp(logit[e] - mx);
  for (int64_t e = 0; e < E; ++e) {
    const double s = c.scoring == ScoringFunc::Sigmoid ? 1.0 / (1.0 + std::exp(-logit[e])) : std::exp(logit[e] - mx) / sum;
    sel[size_t(e)] = s + (bias ? bias[e] : 0.0);
  }
  auto apart = [](double a, double b) { return std::fabs(a - b) > 1e-5 * (std::fabs(a) + std::fabs(b)) + 1e-12; };
  std::vector<char> keep(size_t(c.n_group), 1);
  if (c.n_group > 1) {
    const int64_t G = E / c.n_group;
    std::vector<std::pair<double, int64_t>> gs;
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<double> v(sel.begin() + g * G, sel.begin() + (g + 1) * G);
      std::sort(v.rbegin(), v.rend());
      gs.push_back({G >= 2 ? v[0] + v[1] : v[0], g});
    }
    std::sort(gs.begin(), gs.end(), [](auto& a, auto& b) { return a.first > b.first; });
    if (c.topk_group < c.n_group && !apart(gs[size_t(c.topk_group - 1)].first, gs[size_t(c.topk_group)].first))
      return false;
    std::fill(keep.begin(), keep.end(), 0);
    for (int64_t j = 0; j < c.topk_group; ++j) keep[size_t(gs[size_t(j)].second)] = 1;
  }
  std::vector<double> elig;
  for (int64_t e = 0; e < E; ++e)
    if (keep[size_t(e / (E / c.n_group))]) elig.push_back(sel[size_t(e)]);
  std::sort(elig.rbegin(), elig.rend());
  const size_t n = std::min(elig.size(), size_t(c.top_k + 1));
  for (size_t i = 0; i + 1 < n; ++i)
    if (!apart(elig[i], elig[i + 1])) return false;
  return true;
}

// Device state of one router problem; outputs are poisoned (NaN / -1) before every run.
struct DeviceRouter {
  cuda::RouterDesc d;
  int T, H;
  DeviceArray<uint16_t> x;
  DeviceArray<float> w, logits, wts;
  DeviceArray<int32_t> ids;
  std::unique_ptr<DeviceArray<float>> bias;
  DeviceArray<uint8_t> ws;
  DeviceRouter(const MoeConfig& c, const Inputs& in)
      : d(cuda::router_desc_from(c)), T(int(in.T)), H(int(in.H)), x(in.x), w(in.w), logits(size_t(in.T * in.E)),
        wts(size_t(in.T * c.top_k)), ids(size_t(in.T * c.top_k)),
        ws(cuda::router_workspace_bytes(in.T, int(in.E))) {
    if (!in.bias.empty()) bias = std::make_unique<DeviceArray<float>>(in.bias);
    FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr, 0, ws.n));  // once, as route() requires
  }
  void poison(cudaStream_t st = nullptr) {
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(logits.ptr, 0xff, logits.n * 4, st));  // NaN
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(wts.ptr, 0xff, wts.n * 4, st));        // NaN
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(ids.ptr, 0xff, ids.n * 4, st));        // -1
  }
  void run(RouterPath p, cudaStream_t st = nullptr) {
    cuda::route(d, x.ptr, w.ptr, bias ? bias->ptr : nullptr, T, H, logits.ptr, ids.ptr, wts.ptr, {ws.ptr, ws.n}, st,
                p);
  }
  bool counters_zero() const {
    std::vector<uint32_t> h(cuda::kRouterCounterSlots);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    FP4MOE_CUDA_CHECK(cudaMemcpy(h.data(), ws.ptr, h.size() * 4, cudaMemcpyDeviceToHost));
    return std::all_of(h.begin(), h.end(), [](uint32_t v) { return v == 0; });
  }
};

struct Outputs {
  std::vector<float> logits, wts;
  std::vector<int32_t> ids;
  bool operator==(const Outputs& o) const {  // bitwise (NaN-safe)
    return logits.size() == o.logits.size() &&
           std::memcmp(logits.data(), o.logits.data(), logits.size() * 4) == 0 &&
           std::memcmp(wts.data(), o.wts.data(), wts.size() * 4) == 0 && ids == o.ids;
  }
};
Outputs download(const DeviceRouter& r) { return {r.logits.download(), r.wts.download(), r.ids.download()}; }

void check_against_cpu(const MoeConfig& c, const Inputs& in, const std::vector<double>& ref,
                       const std::vector<double>& mag, const Outputs& got) {
  const int64_t T = in.T, E = in.E, k = c.top_k;
  const float* bias = in.bias.empty() ? nullptr : in.bias.data();
  // Logits.
  std::vector<float> ref_f(ref.size());
  int64_t bad_logits = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ref_f[i] = float(ref[i]);
    bad_logits += !(std::fabs(double(got.logits[i]) - ref[i]) <= 1e-5 * mag[i] + 1e-30);
  }
  EXPECT_EQ(bad_logits, 0) << "logits outside 1e-5 sum|x w| of " << ref.size();
  EXPECT_LT(test::rel_error(got.logits.data(), ref_f.data(), ref_f.size()), 1e-5);
  // Ids: exact on the GPU's own logits.
  const RoutingResult same = route_cpu(c, got.logits.data(), bias, T);
  int64_t id_mismatch = 0;
  for (size_t i = 0; i < got.ids.size(); ++i) id_mismatch += got.ids[i] != same.topk_ids[i];
  EXPECT_EQ(id_mismatch, 0) << "of " << got.ids.size() << " slots (route_cpu on the GPU's logits)";
  EXPECT_LT(test::rel_error(got.wts.data(), same.topk_weights.data(), got.wts.size()), 1e-5);
  // Ties aside: against the exact logits on every decided token.
  const RoutingResult exact = route_cpu(c, ref_f.data(), bias, T);
  int64_t n_decided = 0, wrong = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (!decided(c, ref.data() + t * E, bias)) continue;
    ++n_decided;
    wrong += !std::equal(got.ids.begin() + t * k, got.ids.begin() + (t + 1) * k, exact.topk_ids.begin() + t * k);
  }
  EXPECT_EQ(wrong, 0) << "of " << n_decided << " decided tokens differ from the exact reference";
  EXPECT_GE(double(n_decided), 0.9 * double(T)) << "too few decided tokens: the margin test says nothing";
}

class RouteTest : public ::testing::TestWithParam<Case> {};

TEST_P(RouteTest, BothPathsMatchCpuAcrossTheSwitch) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const Case rc = GetParam();
  const int64_t H = 512;
  const MoeConfig c = cfg_of(rc, H);
  for (int64_t T : {1, 7, 37, 128, 1000, 4097}) {
    const Inputs in = make_inputs(T, H, rc.E, rc.bias, 100 + uint64_t(T));
    std::vector<double> ref, mag;
    reference_logits(in, ref, mag);
    DeviceRouter r(c, in);
    for (RouterPath p : {RouterPath::Auto, RouterPath::FusedGemv, RouterPath::TiledGemm}) {
      SCOPED_TRACE(::testing::Message() << rc.name << " T=" << T << " path=" << cuda::router_path_name(p));
      r.poison();
      r.run(p);
      check_against_cpu(c, in, ref, mag, download(r));
      EXPECT_TRUE(r.counters_zero());
    }
  }
}

TEST_P(RouteTest, GraphReplayEqualsEagerAndRunsRepeat) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const Case rc = GetParam();
  const MoeConfig c = cfg_of(rc, 256);
  cudaStream_t st;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int64_t T : {1, 7, 37, 1000}) {
    const Inputs in = make_inputs(T, 256, rc.E, rc.bias, 7 + uint64_t(T));
    DeviceRouter r(c, in);
    for (RouterPath p : {RouterPath::Auto, RouterPath::FusedGemv, RouterPath::TiledGemm}) {
      SCOPED_TRACE(::testing::Message() << rc.name << " T=" << T << " path=" << cuda::router_path_name(p));
      r.poison(st);
      r.run(p, st);
      const Outputs eager = download(r);
      // Run twice: the counters the first run left behind must not change the second.
      r.poison(st);
      r.run(p, st);
      EXPECT_TRUE(download(r) == eager) << "second eager run differs";
      EXPECT_TRUE(r.counters_zero());

      cudaGraph_t g;
      cudaGraphExec_t ge;
      FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      r.poison(st);
      r.run(p, st);
      FP4MOE_CUDA_CHECK(cudaStreamEndCapture(st, &g));
      FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      for (int rep = 0; rep < 3; ++rep) {
        FP4MOE_CUDA_CHECK(cudaGraphLaunch(ge, st));
        FP4MOE_CUDA_CHECK(cudaStreamSynchronize(st));
        EXPECT_TRUE(download(r) == eager) << "graph replay " << rep << " differs from eager";
      }
      EXPECT_TRUE(r.counters_zero());
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
    }
  }
  cudaStreamDestroy(st);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, RouteTest,
    ::testing::Values(Case{"glm5", 256, 8, 1, 1, ScoringFunc::Sigmoid, true, true, 2.5f},
                      Case{"deepseek_v3", 256, 8, 8, 4, ScoringFunc::Sigmoid, true, true, 2.5f},
                      Case{"sigmoid_nobias", 256, 8, 1, 1, ScoringFunc::Sigmoid, true, false, 1.0f},
                      Case{"qwen3_softmax", 128, 8, 1, 1, ScoringFunc::Softmax, true, false, 1.0f},
                      Case{"softmax_groups_bias", 64, 4, 4, 2, ScoringFunc::Softmax, false, true, 1.5f},
                      Case{"mixtral", 8, 2, 1, 1, ScoringFunc::Softmax, true, false, 1.0f},
                      Case{"wide1024", 1024, 16, 64, 8, ScoringFunc::Sigmoid, true, true, 1.0f},
                      Case{"odd_e", 90, 6, 1, 1, ScoringFunc::Sigmoid, true, true, 1.0f}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// GLM-5 dimensions (H 6144, E 256, the glm5 preset's routing) around the switch.
TEST(RouteGlm5, MatchesCpuAtFullHidden) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig c = moe::glm5_moe_config();
  for (int64_t T : {1, 8, 32, 33, 128}) {
    const Inputs in = make_inputs(T, c.hidden, c.num_experts, true, 500 + uint64_t(T));
    std::vector<double> ref, mag;
    reference_logits(in, ref, mag);
    DeviceRouter r(c, in);
    for (RouterPath p : {RouterPath::Auto, RouterPath::FusedGemv, RouterPath::TiledGemm}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " path=" << cuda::router_path_name(p));
      r.poison();
      r.run(p);
      check_against_cpu(c, in, ref, mag, download(r));
    }
  }
}

// Constructed ties: every logit equal -> the first k experts in id order, on both paths.
TEST(RouteTies, EqualLogitsPickLowestIds) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const Case rc{"ties", 256, 8, 1, 1, ScoringFunc::Sigmoid, true, false, 1.0f};
  const MoeConfig c = cfg_of(rc, 64);
  for (int64_t T : {1, 7, 100}) {
    Inputs in = make_inputs(T, 64, 256, false, 3);
    std::fill(in.w.begin(), in.w.end(), 0.01f);  // every expert's logit is identical
    DeviceRouter r(c, in);
    for (RouterPath p : {RouterPath::FusedGemv, RouterPath::TiledGemm}) {
      r.poison();
      r.run(p);
      const auto ids = r.ids.download();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < 8; ++s) ASSERT_EQ(ids[size_t(t * 8 + s)], s) << "T=" << T << " t=" << t;
    }
  }
}

TEST(RouteErrors, BadInputsAreErrors) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const Case rc{"e", 16, 2, 1, 1, ScoringFunc::Sigmoid, true, false, 1.0f};
  const MoeConfig c = cfg_of(rc, 64);
  const Inputs in = make_inputs(4, 64, 16, false, 1);
  DeviceRouter r(c, in);
  auto call = [&](const uint16_t* x, int T, int H, size_t ws_bytes, RouterPath p = RouterPath::Auto) {
    cuda::route(r.d, x, r.w.ptr, nullptr, T, H, r.logits.ptr, r.ids.ptr, r.wts.ptr, {r.ws.ptr, ws_bytes}, nullptr, p);
  };
  EXPECT_THROW(call(r.x.ptr, 4, 60, r.ws.n), Error);         // hidden % 8
  EXPECT_THROW(call(r.x.ptr + 1, 4, 64, r.ws.n), Error);     // misaligned x
  EXPECT_THROW(call(nullptr, 4, 64, r.ws.n), Error);         // null x
  EXPECT_THROW(call(r.x.ptr, 4, 64, 16), Error);             // workspace too small
  EXPECT_THROW(call(r.x.ptr, -1, 64, r.ws.n), Error);        // negative T
  r.poison();
  EXPECT_NO_THROW(call(r.x.ptr, 0, 64, r.ws.n));             // T = 0: nothing runs
  for (int32_t id : r.ids.download()) EXPECT_EQ(id, -1);
  cuda::RouterDesc bad = r.d;
  bad.top_k = 64;
  EXPECT_THROW(cuda::route(bad, r.x.ptr, r.w.ptr, nullptr, 4, 64, r.logits.ptr, r.ids.ptr, r.wts.ptr,
                           {r.ws.ptr, r.ws.n}, nullptr),
               Error);
}

TEST(RouteWorkspace, SizesAndPathChoice) {
  EXPECT_EQ(cuda::router_auto_path(1), RouterPath::FusedGemv);
  EXPECT_EQ(cuda::router_auto_path(cuda::kRouterFusedMaxTokens), RouterPath::FusedGemv);
  EXPECT_EQ(cuda::router_auto_path(cuda::kRouterFusedMaxTokens + 1), RouterPath::TiledGemm);
  size_t prev = 0;
  for (int64_t t : {0, 1, 33, 512, 8192}) {
    const size_t b = cuda::router_workspace_bytes(t, 256);
    EXPECT_GE(b, prev);
    EXPECT_GE(b, size_t(cuda::kRouterCounterSlots) * 4);
    prev = b;
  }
  EXPECT_LT(cuda::router_workspace_bytes(8192, 256), size_t(64) << 20);  // stays small
  EXPECT_THROW(cuda::router_workspace_bytes(-1, 256), Error);
}

// ---------------- timing (asserts only that it ran) ----------------
// GLM-5 router (glm5 preset: H 6144, E 256, top-8, sigmoid + bias) alone: route() (auto path)
// vs the old three steps (bf16_to_f32 + pedantic-FP32 cuBLAS SGEMM + route_topk). CUDA events,
// L2 flushed (256 MB memset) before each timed call, median of 20. Floor: max(bytes / 4.2 TB/s,
// FLOPs / 67 TFLOP/s FP32), bytes = W f32 + x bf16 + logits + ids + weights.
// FP4MOE_PERF_T=N times one T only.
TEST(RouterPerf, DISABLED_Glm5Sweep) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeConfig c = moe::glm5_moe_config();
  const int H = int(c.hidden), E = int(c.num_experts), k = int(c.top_k);
  std::vector<int> Ts = {1, 8, 32, 128, 512, 2048, 8192};
  if (const char* env = std::getenv("FP4MOE_PERF_T")) Ts = {std::atoi(env)};
  const int Tm = *std::max_element(Ts.begin(), Ts.end());
  const Inputs in = make_inputs(Tm, H, E, true, 9);
  DeviceRouter r(c, in);
  DeviceArray<float> x_f32(size_t(Tm) * H);
  DeviceArray<int32_t> old_ids(size_t(Tm) * k);
  DeviceArray<float> old_logits(size_t(Tm) * E), old_wts(size_t(Tm) * k);
  DeviceArray<uint8_t> flush(size_t(256) << 20), cublas_ws(size_t(32) << 20);
  cublasHandle_t h;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
  FP4MOE_CUBLAS_CHECK(cublasSetWorkspace(h, cublas_ws.ptr, cublas_ws.n));
  FP4MOE_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
  auto time_us = [&](auto&& fn) { return test::median_event_us(flush.ptr, flush.n, 1, 20, fn); };  // 1 warm-up
  const float* bias = r.bias->ptr;
  std::printf("| T | auto path | fused us | tiled us | old us | old/auto | floor us | auto/floor | ids = old |\n");
  for (int T : Ts) {
    auto route_with = [&](RouterPath p) {
      return time_us([&] {
        cuda::route(r.d, r.x.ptr, r.w.ptr, bias, T, H, r.logits.ptr, r.ids.ptr, r.wts.ptr, {r.ws.ptr, r.ws.n},
                    nullptr, p);
      });
    };
    const double t_fused = route_with(RouterPath::FusedGemv), t_tiled = route_with(RouterPath::TiledGemm);
    const double t_new = route_with(RouterPath::Auto);  // leaves the auto path's ids for the comparison
    const double t_old = time_us([&] {
      cuda::bf16_to_f32(r.x.ptr, x_f32.ptr, int64_t(T) * H, nullptr);
      cuda::router_logits_f32(h, x_f32.ptr, r.w.ptr, old_logits.ptr, T, H, E, nullptr);
      cuda::route_topk(r.d, old_logits.ptr, bias, T, old_ids.ptr, old_wts.ptr, nullptr);
    });
    const std::vector<int32_t> a = r.ids.download(), b = old_ids.download();
    int64_t same = 0;
    for (int t = 0; t < T; ++t) same += std::equal(a.begin() + t * k, a.begin() + (t + 1) * k, b.begin() + t * k);
    const double bytes = double(E) * H * 4 + double(T) * H * 2 + double(T) * E * 4 + double(T) * k * 8;
    const double floor_us = std::max(bytes / 4.2e6, 2.0 * T * E * H / 67e6);
    std::printf("| %d | %s | %.1f | %.1f | %.1f | %.2fx | %.2f | %.1fx | %lld/%d |\n", T,
                cuda::router_path_name(cuda::router_auto_path(T)), t_fused, t_tiled, t_old, t_old / t_new, floor_us,
                t_new / floor_us, (long long)same, T);
    std::fflush(stdout);
    EXPECT_GT(t_new, 0.0);
    EXPECT_GE(double(same), 0.99 * T);
  }
  cublasDestroy(h);
}

}  // namespace
}  // namespace fp4moe
