// The whole GPU MoE layer (moe/moe_layer_cuda.hpp, run through moe/moe_runner.hpp) against the
// CPU backend on random layers: tiny and GLM-5 dimensions, NVFP4 and MXFP4, sigmoid+bias+groups
// and softmax routing, hot and cold experts, T = 1 and T not a multiple of anything (4097: a
// partial last block everywhere), graphs, one workspace shared by two layers, no host
// allocation per forward, and the bad-input errors. Every case runs both shared-expert paths:
// folded into the routed GEMMs (the default; n_sh = 1 and 2) and the separate fallback; a BF16
// shared expert (NVIDIA's NVFP4 checkpoints) runs as its own cuBLASLt MLP.
//
// Comparison, with no token left out:
//   logits:  GPU vs the CPU's own FP32 logits, per token ‖gpu − cpu‖ / ‖cpu‖ < 1e-4 (FP32 sums
//            in different orders);
//   routing: route_cpu run on the GPU's own logits must give IDENTICAL ids for every token
//            (and weights within 1e-4 relative): the selection is the same function;
//   output:  against moe_forward_cpu routed on those same GPU logits (so both backends run the
//            same experts), per token ‖gpu − cpu‖ / ‖cpu‖ < 1e-2 (BF16 activations between the
//            GEMMs and the BF16 down output: ~3e-3 expected).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cpu/grouped_gemm_ref.hpp"
#include "cpu/moe_cpu.hpp"
#include "cuda/common/device.hpp"
#include "cuda/permute/permute.hpp"
#include "moe/moe_layer_cuda.hpp"
#include "moe/moe_runner.hpp"
#include "moe/random_layer.hpp"
#include "moe/shared_fold.hpp"
#include "moe_test_util.hpp"

// Heap allocations made by this thread through operator new, counted while `g_count_allocs`
// is set (ForwardDoesNoHostAllocation).
namespace {
thread_local bool g_count_allocs = false;
thread_local int64_t g_allocs = 0;
}  // namespace
void* operator new(size_t n) {
  if (g_count_allocs) ++g_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

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

// Every GEMM path this GPU runs: Generic always, the sm90 kernel on sm_90.
std::vector<MoeGemmPath> gemm_paths() {
  std::vector<MoeGemmPath> p{MoeGemmPath::Generic};
  if (cuda::current_device().cc == 90) p.push_back(MoeGemmPath::Sm90);
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

// Downloads a forward's result and routing from a runner.
MoeOutput collect(const MoeLayerRunner& r, const DeviceArray<float>& out, int64_t T) {
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(r.stream()));
  const MoeConfig& c = r.layer().config();
  const MoeRoutingView v = r.routing(T);
  MoeOutput o;
  o.out = out.download();
  o.out.resize(size_t(T * c.hidden));
  o.routing.tokens = T;
  o.routing.top_k = c.top_k;
  o.routing.topk_ids.resize(size_t(T * c.top_k));
  o.routing.topk_weights.resize(size_t(T * c.top_k));
  o.logits.resize(size_t(T * c.num_experts));
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.routing.topk_ids.data(), v.topk_ids, o.routing.topk_ids.size() * 4,
                               cudaMemcpyDeviceToHost));
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.routing.topk_weights.data(), v.topk_weights, o.routing.topk_weights.size() * 4,
                               cudaMemcpyDeviceToHost));
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.logits.data(), v.logits, o.logits.size() * 4, cudaMemcpyDeviceToHost));
  return o;
}

// One forward on the GPU into a poisoned output; checks the fold decision.
MoeOutput run_gpu(const MoeLayerWeights& w, const std::vector<float>& xf, int64_t T, MoeGemmPath path, bool fold) {
  MoeCudaOptions opt;
  opt.max_tokens = int(T);
  opt.gemm = path;
  opt.fold_shared = fold;
  const MoeLayerCuda layer(w, opt);
  EXPECT_EQ(layer.shared_folded_pieces(), expected_pieces(w, fold));
  MoeLayerRunner runner(layer, T);
  const DeviceArray<uint16_t> x(to_bf16(xf));
  const DeviceArray<float> out(size_t(T * w.cfg.hidden));  // poisoned (NaN)
  runner.forward(x.ptr, T, out.ptr);
  return collect(runner, out, T);
}

// Per token (row) relative L2 errors of `got` against `ref`: the worst must stay below tol.
void expect_rows_close(const std::vector<float>& got, const std::vector<float>& ref, int64_t cols, double tol,
                       const char* what) {
  const std::vector<double> refd(ref.begin(), ref.end());
  const RowErrors e = compare_rows(got, refd, cols, tol);
  EXPECT_EQ(e.bad_rows, 0) << what << ": " << e.bad_rows << " of " << ref.size() / size_t(cols)
                           << " tokens above " << tol << "; worst token " << e.worst_row << " at " << e.worst;
}

// The CPU side of the comparison for one input: the CPU layer on its own logits (computed
// once), and the CPU layer routed on the GPU's logits (recomputed only when they change: every
// GEMM path and shared-expert path runs the same router).
struct CpuReference {
  const MoeLayerWeights& w;
  const std::vector<float>& x;
  int64_t T;
  MoeOutput own, on_gpu_logits;
  CpuReference(const MoeLayerWeights& w_, const std::vector<float>& x_, int64_t T_)
      : w(w_), x(x_), T(T_), own(moe_forward_cpu(w_, x_.data(), T_)) {}
  const MoeOutput& routed_on(const std::vector<float>& gpu_logits) {
    if (on_gpu_logits.logits != gpu_logits) {
      CpuMoeOptions opt;
      opt.router_logits = gpu_logits.data();
      on_gpu_logits = moe_forward_cpu(w, x.data(), T, opt);
    }
    return on_gpu_logits;
  }
};

// The GPU's result against the CPU backend (see the file comment).
void check_against_cpu(const MoeOutput& gpu, CpuReference& ref) {
  const MoeConfig& c = ref.w.cfg;
  const int64_t k = c.top_k, T = ref.T;
  // Logits: the CPU's own, per token.
  expect_rows_close(gpu.logits, ref.own.logits, c.num_experts, 1e-4, "router logits");
  // Routing: the CPU selection on the GPU's logits gives the same ids, every token.
  const MoeOutput& cpu = ref.routed_on(gpu.logits);
  int64_t differ = 0, first = -1;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s)
      if (gpu.routing.topk_ids[size_t(t * k + s)] != cpu.routing.topk_ids[size_t(t * k + s)]) {
        if (first < 0) first = t;
        ++differ;
      }
  ASSERT_EQ(differ, 0) << "ids differ from route_cpu on the GPU's logits; first token " << first;
  for (int64_t i = 0; i < T * k; ++i)
    ASSERT_NEAR(gpu.routing.topk_weights[size_t(i)], cpu.routing.topk_weights[size_t(i)],
                1e-4 * (1 + std::fabs(cpu.routing.topk_weights[size_t(i)])))
        << "slot " << i;
  // Output: every token, against the CPU layer on the same routing.
  expect_rows_close(gpu.out, cpu.out, c.hidden, 1e-2, "output");
}

// Every GEMM path x {folded, separate shared expert} against the CPU backend, and folded
// against separate on the same GPU path: identical routing, outputs equal per token up to the
// BF16 rounding of differently tiled GEMMs.
void check_layer(const MoeLayerWeights& w, int64_t T, uint64_t seed) {
  const int64_t H = w.cfg.hidden;
  const auto x = test::random_floats(size_t(T * H), seed, -2.f, 2.f);
  CpuReference ref(w, x, T);
  for (MoeGemmPath path : gemm_paths()) {
    MoeOutput by_fold[2];
    for (bool fold : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "gemm " << moe_gemm_path_name(path) << " T=" << T
                                        << (fold ? " folded" : " separate"));
      by_fold[fold] = run_gpu(w, x, T, path, fold);
      check_against_cpu(by_fold[fold], ref);
      if (::testing::Test::HasFatalFailure()) return;
    }
    SCOPED_TRACE(::testing::Message() << "folded vs separate, gemm " << moe_gemm_path_name(path) << " T=" << T);
    ASSERT_EQ(by_fold[1].routing.topk_ids, by_fold[0].routing.topk_ids);
    expect_rows_close(by_fold[1].out, by_fold[0].out, H, 1e-2, "folded vs separate");
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
  CpuReference ref(w, x, T);
  for (bool fold : {true, false}) check_against_cpu(moe_forward_cuda(w, x.data(), T, MoeGemmPath::Auto, fold), ref);
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

// A BF16 shared expert (as NVIDIA's NVFP4 checkpoints store it) runs as a dense cuBLASLt MLP
// beside the FP4 routed experts: every token against the CPU layer (poisoned outputs), tiny and
// GLM-5 dimensions, decode and prefill sizes, both GEMM paths.
TEST(MoeLayerCuda, Bf16SharedExpertMatchesCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 61);
  moe::shared_expert_to_bf16(w);
  ASSERT_EQ(w.shared_w13->format, WeightFormat::BF16);
  ASSERT_EQ(expected_pieces(w, true), 0);
  for (int64_t T : {1, 2, 37, 1000}) check_layer(w, T, 6100 + T);
  MoeConfig g = moe::glm5_moe_config();
  g.num_experts = 16;
  MoeLayerWeights wg = moe::random_moe_layer(g, 62);
  moe::shared_expert_to_bf16(wg);
  for (int64_t T : {1, 19}) check_layer(wg, T, 6200 + T);
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
    const MoeLayerCuda layer(w, opt);
    MoeLayerRunner runner(layer, 777);
    DeviceArray<uint16_t> x(size_t(777 * c.hidden));
    FP4MOE_CUDA_CHECK(cudaMemset(x.ptr, 0, x.n * 2));
    DeviceArray<float> out(size_t(777 * c.hidden));
    runner.forward(x.ptr, 777, out.ptr);
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
    const int64_t n_sh = layer.shared_folded_pieces();
    ASSERT_EQ(n_sh, fold ? 1 : 0);
    std::vector<int32_t> off(size_t(c.num_experts + n_sh + 1));
    FP4MOE_CUDA_CHECK(cudaMemcpy(off.data(), runner.routing(777).expert_offsets, off.size() * 4, cudaMemcpyDeviceToHost));
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

// Runs body(weights, layer, runner) for an FP4 shared expert of 1 and 2 pieces and a BF16 one
// x every GEMM path x folded / separate shared expert (a tiny layer, max_tokens 64, a runner
// for 64 tokens). The BF16 shared expert is never folded.
template <typename Body>
void for_each_layer_kind(Body&& body) {
  for (int64_t kind : {1, 2, 0}) {  // 1, 2: FP4 pieces; 0: BF16 shared expert
    const int64_t pieces = kind == 0 ? 0 : kind;
    MoeConfig c = tiny_cfg();
    c.shared_inter = std::max<int64_t>(pieces, 1) * c.inter;
    MoeLayerWeights w = moe::random_moe_layer(c, 7);
    if (kind == 0) moe::shared_expert_to_bf16(w);
    for (MoeGemmPath path : gemm_paths())
      for (bool fold : {true, false}) {
        SCOPED_TRACE(::testing::Message() << moe_gemm_path_name(path) << (fold ? " folded " : " separate ")
                                          << (kind == 0 ? "bf16 shared" : "fp4 shared pieces ") << pieces);
        MoeCudaOptions opt;
        opt.max_tokens = 64;
        opt.gemm = path;
        opt.fold_shared = fold;
        const MoeLayerCuda layer(w, opt);
        ASSERT_EQ(layer.shared_folded_pieces(), fold ? pieces : 0);
        MoeLayerRunner runner(layer, 64);
        body(w, layer, runner);
        if (::testing::Test::HasFatalFailure()) return;
      }
  }
}

std::vector<float> download_f32(const float* p, size_t n) {
  std::vector<float> h(n);
  FP4MOE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

TEST(MoeLayerCuda, TwoEagerForwardsAreBitwiseEqual) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for_each_layer_kind([](const MoeLayerWeights& w, const MoeLayerCuda&, MoeLayerRunner& runner) {
    const int64_t H = w.cfg.hidden, T = 5;
    const DeviceArray<uint16_t> x(to_bf16(test::random_floats(size_t(T * H), 8, -2.f, 2.f)));
    DeviceArray<float> out1(size_t(T * H)), out2(size_t(T * H));
    runner.forward(x.ptr, T, out1.ptr);
    runner.forward(x.ptr, T, out2.ptr);
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
    const auto e1 = out1.download(), e2 = out2.download();
    ASSERT_EQ(0, std::memcmp(e1.data(), e2.data(), e1.size() * 4)) << "two eager runs differ";
  });
}

// A replayed graph computes what the eager forward of the same rows computes, bit for bit:
// buckets 8 and 64 replayed for 5 and 50 real tokens (the padding rows are zeros) against eager
// forwards of the whole bucket on the same input, three replays each. Then the real rows of a
// padded bucket against an eager forward of the real rows alone (not bitwise: the batch differs,
// so tile and split choices may), per token.
TEST(MoeLayerCuda, GraphCaptureMatchesEager) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for_each_layer_kind([](const MoeLayerWeights& w, const MoeLayerCuda&, MoeLayerRunner& runner) {
    const int64_t H = w.cfg.hidden;
    runner.capture_graph(8);
    runner.capture_graph(64);
    EXPECT_EQ(runner.graph_buckets(), (std::vector<int64_t>{8, 64}));
    for (const auto& [T, bucket] : {std::pair<int64_t, int64_t>{5, 8}, {50, 64}}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " bucket " << bucket);
      const std::vector<uint16_t> xb = to_bf16(test::random_floats(size_t(T * H), 9 + T, -2.f, 2.f));
      FP4MOE_CUDA_CHECK(cudaMemset(runner.graph_input(), 0, size_t(64 * H) * 2));
      FP4MOE_CUDA_CHECK(cudaMemcpy(runner.graph_input(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      // Eager on a copy of the same bucket rows (the graph's input buffer stays untouched).
      DeviceArray<uint16_t> x_bucket(size_t(bucket * H));
      FP4MOE_CUDA_CHECK(cudaMemcpy(x_bucket.ptr, runner.graph_input(), size_t(bucket * H) * 2,
                                   cudaMemcpyDeviceToDevice));
      DeviceArray<float> eager(size_t(bucket * H)), eager_real(size_t(T * H));
      runner.forward(x_bucket.ptr, bucket, eager.ptr);
      runner.forward(x_bucket.ptr, T, eager_real.ptr);
      const std::vector<float> e = eager.download(), e_real = eager_real.download();
      for (int rep = 0; rep < 3; ++rep) {
        FP4MOE_CUDA_CHECK(cudaMemset(runner.graph_output(), 0xff, size_t(64 * H) * 4));  // poison
        runner.replay_graph(T);
        FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
        const std::vector<float> g = download_f32(runner.graph_output(), size_t(bucket * H));
        ASSERT_EQ(0, std::memcmp(g.data(), e.data(), g.size() * 4)) << "replay " << rep << " differs from eager";
      }
      const std::vector<float> g_real(e.begin(), e.begin() + T * H);
      expect_rows_close(g_real, e_real, H, 1e-2, "padded bucket rows vs eager of the real rows");
    }
    EXPECT_THROW(runner.replay_graph(65), Error);
  });
}

// One workspace serves every layer: two different layers, one after the other on one stream in
// one workspace (sized for the larger), give bit for bit what each gives in a fresh workspace.
TEST(MoeLayerCuda, OneWorkspaceServesTwoLayers) {
  FP4MOE_SKIP_WITHOUT_GPU();
  MoeConfig ca = tiny_cfg(), cb = tiny_cfg();
  cb.num_experts = 32;
  cb.top_k = 6;
  cb.n_group = cb.topk_group = 1;
  const MoeLayerWeights wa = moe::random_moe_layer(ca, 51), wb = moe::random_moe_layer(cb, 52);
  MoeCudaOptions opt;
  opt.max_tokens = 300;
  const MoeLayerCuda a(wa, opt), b(wb, opt);
  const int64_t H = ca.hidden, T = 300;
  const DeviceArray<uint16_t> x(to_bf16(test::random_floats(size_t(T * H), 53, -2.f, 2.f)));
  auto alone = [&](const MoeLayerCuda& l) {
    MoeLayerRunner r(l, T);
    DeviceArray<float> out(size_t(T * H));
    r.forward(x.ptr, T, out.ptr);
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(r.stream()));
    return out.download();
  };
  const std::vector<float> ra = alone(a), rb = alone(b);
  cuda::DeviceBuffer ws(std::max(a.workspace_bytes(T), b.workspace_bytes(T)));
  FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr(), 0, ws.bytes()));
  const MoeWorkspace mw{ws.ptr(), ws.bytes()};
  DeviceArray<float> oa(size_t(T * H)), ob(size_t(T * H)), oa2(size_t(T * H));
  a.forward(x.ptr, T, oa.ptr, mw, nullptr);
  b.forward(x.ptr, T, ob.ptr, mw, nullptr);
  a.forward(x.ptr, 37, oa2.ptr, mw, nullptr);  // a smaller batch through the same workspace
  a.forward(x.ptr, T, oa2.ptr, mw, nullptr);
  EXPECT_EQ(oa.download(), ra);
  EXPECT_EQ(ob.download(), rb);
  EXPECT_EQ(oa2.download(), ra);
}

// forward() at T = 1 allocates nothing on the host (the configs were resolved at construction;
// the checks build no message unless they fail), on both GEMM paths and both shared-expert
// paths; and its host time per call is printed (bench moe reports it at GLM-5 size).
TEST(MoeLayerCuda, ForwardDoesNoHostAllocation) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for_each_layer_kind([](const MoeLayerWeights& w, const MoeLayerCuda& layer, MoeLayerRunner& runner) {
    const int64_t H = w.cfg.hidden;
    const DeviceArray<uint16_t> x(to_bf16(test::random_floats(size_t(H), 11, -2.f, 2.f)));
    DeviceArray<float> out{size_t(H)};
    runner.forward(x.ptr, 1, out.ptr);  // warm-up: per-device kernel attributes, module loads
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
    const MoeWorkspace ws = runner.workspace();
    constexpr int kCalls = 50;
    g_allocs = 0;
    g_count_allocs = true;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) layer.forward(x.ptr, 1, out.ptr, ws, runner.stream());
    const auto t1 = std::chrono::steady_clock::now();
    g_count_allocs = false;
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
    EXPECT_EQ(g_allocs, 0) << "operator new calls in " << kCalls << " forwards";
    std::printf("host time per forward at T=1 (%s): %.1f us\n", layer.gemm_configs(1).c_str(),
                std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls);
  });
}

TEST(MoeLayerCuda, W4a4EmulationIsCloseToW4a16) {
  FP4MOE_SKIP_WITHOUT_GPU();
  if (cuda::current_device().cc != 90) GTEST_SKIP() << "W4A4 emulation runs on the sm90 path";
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 12);
  const int64_t T = 200, H = 256;
  const auto xf = test::random_floats(size_t(T * H), 13, -2.f, 2.f);
  const DeviceArray<uint16_t> x(to_bf16(xf));
  DeviceArray<float> out(size_t(T * H));
  MoeCudaOptions opt;
  opt.max_tokens = int(T);
  opt.w4a4 = true;
  const MoeLayerCuda layer(w, opt);
  MoeLayerRunner runner(layer, T);
  runner.forward(x.ptr, T, out.ptr);
  const MoeOutput gpu = collect(runner, out, T);
  CpuMoeOptions on_gpu_logits;
  on_gpu_logits.router_logits = gpu.logits.data();
  const MoeOutput cpu = moe_forward_cpu(w, xf.data(), T, on_gpu_logits);
  // NVFP4 activations (4-bit, block 16) cost ~10 % relative error against BF16 ones; this
  // checks the mode runs end to end and is the same function, not its exact numerics
  // (those are tested against a CPU fake-quant reference in moe_gemm_test).
  EXPECT_LT(test::rel_error(gpu.out.data(), cpu.out.data(), gpu.out.size()), 0.25);
}

TEST(MoeLayerCuda, StageTimingRunsEveryStage) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 10);
  MoeLayerWeights wb = w;  // a BF16 shared expert: the separate "shared" stage
  moe::shared_expert_to_bf16(wb);
  for (const auto& [weights, fold] : {std::pair{&w, true}, {&w, false}, {&wb, true}}) {
    const bool folded = fold && weights == &w;
    MoeCudaOptions opt;
    opt.max_tokens = 100;
    opt.fold_shared = fold;
    const MoeLayerCuda layer(*weights, opt);
    MoeLayerRunner runner(layer, 100);
    DeviceArray<uint16_t> x(size_t(100 * 256));
    FP4MOE_CUDA_CHECK(cudaMemset(x.ptr, 0, x.n * 2));
    DeviceArray<float> out(size_t(100 * 256));
    const auto ms = runner.forward_timed(x.ptr, 100, out.ptr);
    for (int s = 0; s < kNumMoeStages; ++s) {
      if (folded && MoeStage(s) == MoeStage::Shared)
        EXPECT_EQ(ms[size_t(s)], 0.f) << "folded: the shared expert is inside gemm1/gemm2";
      else
        EXPECT_GT(ms[size_t(s)], 0.f) << moe_stage_name(MoeStage(s)) << (folded ? " folded" : " separate");
    }
  }
}

TEST(MoeLayerCuda, BadInputIsAClearError) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const MoeLayerWeights w = moe::random_moe_layer(tiny_cfg(), 11);
  MoeCudaOptions opt;
  opt.max_tokens = 16;
  const MoeLayerCuda layer(w, opt);
  MoeLayerRunner runner(layer, 16);
  DeviceArray<uint16_t> x(size_t(32 * 256));
  DeviceArray<float> out(size_t(32 * 256));
  auto expect_error = [](auto&& fn, const char* piece) {
    try {
      fn();
      ADD_FAILURE() << "accepted; expected an error with '" << piece << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
  };
  expect_error([&] { runner.forward(x.ptr, 17, out.ptr); }, "exceed the layer's maximum");
  const MoeWorkspace small{runner.workspace().ptr, layer.workspace_bytes(4) - 256};
  expect_error([&] { layer.forward(x.ptr, 4, out.ptr, small, runner.stream()); }, "workspace");
  expect_error([&] { layer.forward(x.ptr, 4, out.ptr, MoeWorkspace{}, runner.stream()); }, "workspace");
  expect_error([&] { layer.forward(x.ptr + 1, 4, out.ptr, runner.workspace(), runner.stream()); }, "16-byte aligned");
  expect_error([&] { runner.forward(nullptr, 4, out.ptr); }, "null input");
  std::vector<float> xh(4 * 256);
  MoeLayerWeights bad_h = w;
  EXPECT_THROW(moe_forward_cuda(bad_h, xh.data(), 0), Error);
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
  bad = w;  // a BF16 shared gate_up with an FP4 shared down
  moe::shared_expert_to_bf16(bad);
  bad.shared_w2 = w.shared_w2;
  expect_error([&] { MoeLayerCuda l(bad, opt); }, "both FP4 or both BF16");
  MoeCudaOptions zero;
  EXPECT_THROW({ MoeLayerCuda l(w, zero); }, Error);
}

}  // namespace
}  // namespace fp4moe
