// The whole GPU MoE layer (moe/moe_layer_cuda.hpp) against the CPU backend
// (moe_forward_cpu) on random layers: tiny and GLM-5 dimensions, NVFP4 and MXFP4,
// sigmoid+bias+groups and softmax routing, hot and cold experts, T = 1 and T not a
// multiple of anything, graph capture + replay, and the bad-input errors. Every case runs
// both shared-expert paths: folded into the routed GEMMs (the default; n_sh = 1 and 2) and
// the separate fallback (MoeCudaOptions::fold_shared = false, or an incompatible shape).
//
// Comparison: the two backends compute router logits in FP32 with different summation
// orders, so a token whose 8th/9th scores are within ~1e-6 may legitimately pick a
// different expert; such a token's output differs completely. We therefore require
// >= 99 % of tokens with identical top-k ids and compare the outputs of those tokens
// (rel err < 1e-2: BF16 activations between the GEMMs and the BF16 down output are the
// expected error, ~3e-3). The exact-ids property on identical logits is tested in
// moe_routing_test.cpp.
#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cpu/moe_cpu.hpp"
#include "moe/moe_layer_cuda.hpp"
#include "cuda/permute/permute.hpp"
#include "moe/random_layer.hpp"
#include "moe/shared_fold.hpp"
#include "moe_test_util.hpp"

namespace fp4moe {
namespace {

using test::DeviceArray;

MoeConfig tiny_cfg() {
  MoeConfig c;
  c.hidden = 256;
  c.inter = 128;
  c.num_experts = 16;
  c.top_k = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.scoring = ScoringFunc::Sigmoid;
  c.norm_topk_prob = true;
  c.routed_scaling = 2.5f;
  c.shared_inter = 128;
  return c;
}

struct Compared {
  double rel_err = 0;
  double id_match = 0;  // fraction of tokens with identical ids
};

Compared compare(const MoeOutput& gpu, const MoeOutput& cpu, int64_t T, int64_t H, int64_t k) {
  std::vector<float> a, b;
  int64_t same = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool eq = true;
    for (int64_t s = 0; s < k; ++s) eq = eq && gpu.routing.topk_ids[size_t(t * k + s)] == cpu.routing.topk_ids[size_t(t * k + s)];
    if (!eq) continue;
    ++same;
    a.insert(a.end(), gpu.out.begin() + t * H, gpu.out.begin() + (t + 1) * H);
    b.insert(b.end(), cpu.out.begin() + t * H, cpu.out.begin() + (t + 1) * H);
  }
  Compared c;
  c.id_match = double(same) / double(T);
  c.rel_err = a.empty() ? INFINITY : test::rel_error(a.data(), b.data(), a.size());
  return c;
}

int device_sm() {
  cudaDeviceProp p{};
  FP4MOE_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  return p.major * 10 + p.minor;
}

// Every GEMM path this GPU runs: Generic always, the sm90 kernel on sm_90.
std::vector<MoeGemmPath> gemm_paths() {
  std::vector<MoeGemmPath> p{MoeGemmPath::Generic};
  if (device_sm() == 90) p.push_back(MoeGemmPath::Sm90);
  return p;
}

// The folded pieces a layer of these weights must get (0: separate shared expert).
int64_t expected_pieces(const MoeLayerWeights& w, bool fold) {
  return fold ? moe::shared_fold_pieces(w, cuda::kMaxPermuteExtraExperts) : 0;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
  return b;
}

// One forward on the GPU into a poisoned output; checks the fold decision.
MoeOutput run_gpu(const MoeLayerWeights& w, const std::vector<float>& xf, int64_t T, MoeGemmPath path, bool fold) {
  MoeCudaOptions opt;
  opt.max_tokens = int(T);
  opt.gemm = path;
  opt.fold_shared = fold;
  MoeLayerCuda layer(w, opt);
  EXPECT_EQ(layer.shared_folded_pieces(), expected_pieces(w, fold));
  const int64_t H = w.cfg.hidden, k = w.cfg.top_k;
  DeviceArray<uint16_t> x(to_bf16(xf));
  DeviceArray<float> out(size_t(T * H));  // poisoned (NaN)
  layer.forward(x.ptr, T, H, out.ptr, nullptr);
  MoeOutput o;
  o.out = out.download();
  o.routing.tokens = T;
  o.routing.top_k = k;
  o.routing.topk_ids.resize(size_t(T * k));
  o.routing.topk_weights.resize(size_t(T * k));
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.routing.topk_ids.data(), layer.topk_ids(), size_t(T * k) * 4, cudaMemcpyDeviceToHost));
  FP4MOE_CUDA_CHECK(
      cudaMemcpy(o.routing.topk_weights.data(), layer.topk_weights(), size_t(T * k) * 4, cudaMemcpyDeviceToHost));
  return o;
}

void check_against_cpu(const MoeOutput& gpu, const MoeOutput& cpu, const MoeLayerWeights& w, int64_t T) {
  const Compared c = compare(gpu, cpu, T, w.cfg.hidden, w.cfg.top_k);
  EXPECT_GE(c.id_match, T < 100 ? 1.0 : 0.99) << "T=" << T;
  EXPECT_LT(c.rel_err, 1e-2) << "T=" << T;
  // Routing weights of matching tokens: float rounding only.
  for (int64_t i = 0; i < T * w.cfg.top_k; ++i)
    if (gpu.routing.topk_ids[size_t(i)] == cpu.routing.topk_ids[size_t(i)]) {
      ASSERT_NEAR(gpu.routing.topk_weights[size_t(i)], cpu.routing.topk_weights[size_t(i)],
                  1e-4 * (1 + std::fabs(cpu.routing.topk_weights[size_t(i)])));
    }
}

// Every GEMM path x {folded, separate shared expert} against the CPU backend (computed
// once), and folded against separate on the same GPU path: identical routing, outputs equal
// up to the BF16 rounding of differently tiled GEMMs.
void check_layer(const MoeLayerWeights& w, int64_t T, uint64_t seed) {
  const int64_t H = w.cfg.hidden;
  const auto x = test::random_floats(size_t(T * H), seed, -2.f, 2.f);
  const MoeOutput cpu = moe_forward_cpu(w, x.data(), T);
  for (MoeGemmPath path : gemm_paths()) {
    MoeOutput by_fold[2];
    for (bool fold : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "gemm " << moe_gemm_path_name(path) << " T=" << T
                                        << (fold ? " folded" : " separate"));
      by_fold[fold] = run_gpu(w, x, T, path, fold);
      check_against_cpu(by_fold[fold], cpu, w, T);
    }
    SCOPED_TRACE(::testing::Message() << "folded vs separate, gemm " << moe_gemm_path_name(path) << " T=" << T);
    ASSERT_EQ(by_fold[1].routing.topk_ids, by_fold[0].routing.topk_ids);
    EXPECT_LT(test::rel_error(by_fold[1].out.data(), by_fold[0].out.data(), by_fold[0].out.size()), 5e-3);
  }
}

TEST(MoeLayerCuda, TinyNvfp4MatchesCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 1);
  ASSERT_EQ(expected_pieces(w, true), 1);
  for (int64_t T : {1, 2, 37, 1000, 4097}) check_layer(w, T, 100 + T);
}

// The one-shot CLI helper (run-moe --backend cuda), both shared-expert paths.
TEST(MoeLayerCuda, OneShotHelperMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 21);
  const int64_t T = 37;
  const auto x = test::random_floats(size_t(T * w.cfg.hidden), 22, -2.f, 2.f);
  const MoeOutput cpu = moe_forward_cpu(w, x.data(), T);
  for (bool fold : {true, false})
    check_against_cpu(moe_forward_cuda(w, x.data(), T, w.cfg.hidden, MoeGemmPath::Auto, fold), cpu, w, T);
}

// shared_inter = 2 * inter: two folded pieces (experts E and E+1), each token gets k + 2 rows.
TEST(MoeLayerCuda, TwoSharedPiecesMatchCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig c = tiny_cfg();
  c.shared_inter = 2 * c.inter;
  const MoeLayerWeights w = moe::random_moe_layer(c, 31);
  ASSERT_EQ(expected_pieces(w, true), 2);
  for (int64_t T : {1, 37, 300, 1000}) check_layer(w, T, 3100 + T);
  MoeConfig g = moe::glm5_moe_config();
  g.num_experts = 16;
  g.shared_inter = 2 * g.inter;
  const MoeLayerWeights wg = moe::random_moe_layer(g, 32);
  for (int64_t T : {1, 37}) check_layer(wg, T, 3200 + T);
}

// Shared experts that cannot be folded run on the separate path (and still match the CPU).
TEST(MoeLayerCuda, IncompatibleSharedExpertFallsBack) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig c = tiny_cfg();
  c.shared_inter = 3 * c.inter / 2;  // 192: not a multiple of inter
  const MoeLayerWeights w = moe::random_moe_layer(c, 41);
  ASSERT_EQ(expected_pieces(w, true), 0);
  for (int64_t T : {1, 100}) check_layer(w, T, 4100 + T);
  // NVFP4 routed experts with an MXFP4 shared expert.
  MoeLayerWeights mixed = moe::random_moe_layer(tiny_cfg(), 42);
  const MoeLayerWeights mx = moe::random_moe_layer(tiny_cfg(), 43, WeightFormat::MXFP4);
  mixed.shared_w13 = mx.shared_w13;
  mixed.shared_w2 = mx.shared_w2;
  ASSERT_EQ(expected_pieces(mixed, true), 0);
  check_layer(mixed, 50, 4300);
}

TEST(MoeLayerCuda, TinyMxfp4MatchesCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 2, WeightFormat::MXFP4);
  for (int64_t T : {1, 1000}) check_layer(w, T, 200 + T);
}

TEST(MoeLayerCuda, SoftmaxNoSharedMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig c = tiny_cfg();
  c.scoring = ScoringFunc::Softmax;
  c.n_group = c.topk_group = 1;
  c.num_experts = 32;
  c.top_k = 8;
  c.routed_scaling = 1.0f;
  c.shared_inter = 0;
  MoeLayerWeights w = moe::random_moe_layer(c, 3);
  w.router_bias.clear();
  for (int64_t T : {1, 333}) check_layer(w, T, 300 + T);
}

TEST(MoeLayerCuda, Glm5DimsMatchCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig c = moe::glm5_moe_config();
  c.num_experts = 32;  // GLM-5's H, I, top-8, shared expert; fewer experts keep the CPU reference quick
  const MoeLayerWeights w = moe::random_moe_layer(c, 4);
  ASSERT_EQ(expected_pieces(w, true), 1);
  for (int64_t T : {1, 19, 37}) check_layer(w, T, 400 + T);
}

TEST(MoeLayerCuda, Glm5DimsT1000MatchesCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig c = moe::glm5_moe_config();
  c.num_experts = 32;
  const MoeLayerWeights w = moe::random_moe_layer(c, 4);
  check_layer(w, 1000, 1400);  // chunked permutation path (T * R > 1024)
}

TEST(MoeLayerCuda, HotAndColdExperts) {
  FP4MOE_SKIP_WITHOUT_GPU();
  // Hot: top-1 routing with a huge bias on expert 5: all tokens go to one expert.
  MoeConfig c = tiny_cfg();
  c.top_k = 1;
  c.n_group = c.topk_group = 1;
  MoeLayerWeights w = moe::random_moe_layer(c, 5);
  w.router_bias[5] = 100.f;
  check_layer(w, 777, 500);
  check_layer(w, 100, 501);  // fused small permutation path (T * R <= 1024)
  for (bool fold : {true, false}) {
    MoeCudaOptions opt;
    opt.max_tokens = 777;
    opt.fold_shared = fold;
    MoeLayerCuda layer(w, opt);
    DeviceArray<uint16_t> x(size_t(777 * c.hidden));
    FP4MOE_CUDA_CHECK(cudaMemset(x.ptr, 0, x.n * 2));
    DeviceArray<float> out(size_t(777 * c.hidden));
    layer.forward(x.ptr, 777, c.hidden, out.ptr, nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t n_sh = layer.shared_folded_pieces();
    ASSERT_EQ(n_sh, fold ? 1 : 0);
    std::vector<int32_t> off(size_t(c.num_experts + n_sh + 1));
    FP4MOE_CUDA_CHECK(cudaMemcpy(off.data(), layer.expert_offsets(), off.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(off[6] - off[5], 777);
    if (fold) {
      EXPECT_EQ(off[size_t(c.num_experts) + 1] - off[size_t(c.num_experts)], 777);  // the shared piece
    }
    EXPECT_EQ(off.back(), 777 * (1 + n_sh));
  }
  // Cold: three quarters of the experts can never win.
  MoeLayerWeights w2 = moe::random_moe_layer(tiny_cfg(), 6);
  for (int64_t e = 0; e < w2.cfg.num_experts; ++e)
    if (e % 4 != 0) w2.router_bias[size_t(e)] = -100.f;
  w2.cfg.n_group = w2.cfg.topk_group = 1;
  check_layer(w2, 1000, 600);
  check_layer(w2, 37, 601);
}

TEST(MoeLayerCuda, DeterministicAndGraphReplayMatchesEager) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int64_t pieces : {1, 2}) {
  MoeConfig c = tiny_cfg();
  c.shared_inter = pieces * c.inter;
  const MoeLayerWeights w = moe::random_moe_layer(c, 7);
  for (MoeGemmPath path : gemm_paths())
  for (bool fold : {true, false}) {
  SCOPED_TRACE(::testing::Message() << moe_gemm_path_name(path) << (fold ? " folded " : " separate ") << pieces);
  MoeCudaOptions opt;
  opt.max_tokens = 64;
  opt.gemm = path;
  opt.fold_shared = fold;
  MoeLayerCuda layer(w, opt);
  ASSERT_EQ(layer.shared_folded_pieces(), fold ? pieces : 0);
  const int64_t H = c.hidden, T = 5;
  std::vector<uint16_t> xb(size_t(T * H));
  const auto xf = test::random_floats(xb.size(), 8, -2.f, 2.f);
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = float_to_bf16(xf[i]);
  DeviceArray<uint16_t> x(xb);
  DeviceArray<float> out1(size_t(T * H)), out2(size_t(T * H));
  layer.forward(x.ptr, T, H, out1.ptr, nullptr);
  layer.forward(x.ptr, T, H, out2.ptr, nullptr);
  const auto e1 = out1.download(), e2 = out2.download();
  ASSERT_EQ(0, std::memcmp(e1.data(), e2.data(), e1.size() * 4)) << "two eager runs differ";

  layer.capture_graph(8);
  layer.capture_graph(64);
  EXPECT_EQ(layer.graph_buckets(), (std::vector<int64_t>{8, 64}));
  FP4MOE_CUDA_CHECK(cudaMemcpy(layer.graph_input(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  for (int rep = 0; rep < 3; ++rep) {
    FP4MOE_CUDA_CHECK(cudaMemset(layer.graph_output(), 0xff, size_t(T * H) * 4));  // poison
    layer.replay_graph(T, nullptr);  // bucket 8: rows 5..7 are padding
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> g(size_t(T * H));
    FP4MOE_CUDA_CHECK(cudaMemcpy(g.data(), layer.graph_output(), g.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_LT(test::rel_error(g.data(), e1.data(), g.size()), 1e-5) << "replay " << rep;
  }
  // A larger batch through the same graphs (bucket 64).
  const int64_t T2 = 50;
  const auto xf2 = test::random_floats(size_t(T2 * H), 9, -2.f, 2.f);
  std::vector<uint16_t> xb2(xf2.size());
  for (size_t i = 0; i < xb2.size(); ++i) xb2[i] = float_to_bf16(xf2[i]);
  FP4MOE_CUDA_CHECK(cudaMemcpy(layer.graph_input(), xb2.data(), xb2.size() * 2, cudaMemcpyHostToDevice));
  layer.replay_graph(T2, nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> g2(size_t(T2 * H));
  FP4MOE_CUDA_CHECK(cudaMemcpy(g2.data(), layer.graph_output(), g2.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<float> ref2(xf2.size());
  for (size_t i = 0; i < xf2.size(); ++i) ref2[i] = xf2[i];
  const MoeOutput cpu = moe_forward_cpu(w, ref2.data(), T2);
  EXPECT_LT(test::rel_error(g2.data(), cpu.out.data(), g2.size()), 1e-2);
  EXPECT_THROW(layer.replay_graph(65, nullptr), Error);
  }
  }
}

TEST(MoeLayerCuda, W4a4EmulationIsCloseToW4a16) {
  FP4MOE_SKIP_WITHOUT_GPU();
  if (device_sm() != 90) GTEST_SKIP() << "W4A4 emulation runs on the sm90 path";
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 12);
  const int64_t T = 200, H = 256;
  const auto xf = test::random_floats(size_t(T * H), 13, -2.f, 2.f);
  std::vector<uint16_t> xb(xf.size());
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = float_to_bf16(xf[i]);
  DeviceArray<uint16_t> x(xb);
  DeviceArray<float> out(size_t(T * H));
  MoeCudaOptions opt;
  opt.max_tokens = int(T);
  opt.w4a4 = true;
  MoeLayerCuda layer(w, opt);
  layer.forward(x.ptr, T, H, out.ptr, nullptr);
  const auto o = out.download();
  const MoeOutput cpu = moe_forward_cpu(w, xf.data(), T);
  // NVFP4 activations (4-bit, block 16) cost ~10 % relative error against BF16 ones; this
  // checks the mode runs end to end and is the same function, not its exact numerics
  // (those are tested against a CPU fake-quant reference in moe_gemm_test).
  EXPECT_LT(test::rel_error(o.data(), cpu.out.data(), o.size()), 0.25);
}

TEST(MoeLayerCuda, StageTimingRunsEveryStage) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 10);
  for (bool fold : {true, false}) {
    MoeCudaOptions opt;
    opt.max_tokens = 100;
    opt.fold_shared = fold;
    MoeLayerCuda layer(w, opt);
    DeviceArray<uint16_t> x(size_t(100 * 256));
    FP4MOE_CUDA_CHECK(cudaMemset(x.ptr, 0, x.n * 2));
    DeviceArray<float> out(size_t(100 * 256));
    layer.set_stage_timing(true);
    layer.forward(x.ptr, 100, 256, out.ptr, nullptr);
    const auto ms = layer.last_stage_ms();
    for (int s = 0; s < kNumMoeStages; ++s) {
      if (fold && MoeStage(s) == MoeStage::Shared)
        EXPECT_EQ(ms[size_t(s)], 0.f) << "folded: the shared expert is inside gemm1/gemm2";
      else
        EXPECT_GT(ms[size_t(s)], 0.f) << moe_stage_name(MoeStage(s)) << (fold ? " folded" : " separate");
    }
    EXPECT_THROW(layer.capture_graph(8), Error);  // timing must be off for capture
  }
}

TEST(MoeLayerCuda, BadInputIsAClearError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 11);
  MoeCudaOptions opt;
  opt.max_tokens = 16;
  MoeLayerCuda layer(w, opt);
  DeviceArray<uint16_t> x(size_t(32 * 256));
  DeviceArray<float> out(size_t(32 * 256));
  try {
    layer.forward(x.ptr, 17, 256, out.ptr, nullptr);
    FAIL() << "T above max_tokens accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace maximum"), std::string::npos) << e.what();
  }
  try {
    layer.forward(x.ptr, 4, 255, out.ptr, nullptr);
    FAIL() << "wrong hidden size accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size"), std::string::npos) << e.what();
  }
  std::vector<float> xh(4 * 200);
  EXPECT_THROW(moe_forward_cuda(w, xh.data(), 4, 200), Error);
  // Broken layers are refused at upload.
  MoeLayerWeights bad = w;
  bad.router_w.resize(10);
  EXPECT_THROW({ MoeLayerCuda l(bad, opt); }, Error);
  bad = w;
  bad.w2.n = 128;
  EXPECT_THROW({ MoeLayerCuda l(bad, opt); }, Error);
  bad = w;
  bad.w13.format = WeightFormat::BF16;
  EXPECT_THROW({ MoeLayerCuda l(bad, opt); }, Error);
  MoeCudaOptions zero;
  EXPECT_THROW({ MoeLayerCuda l(w, zero); }, Error);
}

}  // namespace
}  // namespace fp4moe
