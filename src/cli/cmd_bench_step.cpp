// fp4moe bench step --model DIR [--batch 1,8,64,256,1024] [--ctx 1024,8192] [--prefill 1024,4096,16384]
//
// Times the GPU runner's model step on a checkpoint (e.g. make-synthetic --preset glm5-layer):
// decode steps at batch B × context L (every request one token at position L-1; replayed from
// the decode graphs up to the largest B) and prefill steps of one request of P tokens, each
// host-inclusive (metadata upload + launch + results back). Floors: all weight bytes + the KV
// bytes read at the measured copy bandwidth (an upper bound of the bytes a decode step touches:
// at small B only the hit experts are read). Not yet: per-stage breakdown, K steps per launch.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "core/error.hpp"

#if defined(FP4MOE_HAVE_GPU_RUNNER)
#include <cuda_runtime_api.h>

#include "cuda/bench/bench_util.hpp"
#include "cuda/common/device.hpp"
#include "engine/gpu/gpu_runner.hpp"
#endif

namespace fp4moe::cli {
namespace {

struct BenchStepArgs {
  std::string model;
  std::vector<int64_t> batch = {1, 8, 64, 256, 1024}, ctx = {1024, 8192}, prefill = {1024, 4096, 16384};
  int iters = 20;
  double mem_fraction_static = 0.88;
};

#if defined(FP4MOE_HAVE_GPU_RUNNER)
int run_bench_step(const BenchStepArgs& a) {
  FP4MOE_CHECK(cuda::device_available(), "bench step needs a CUDA GPU, and none is visible");
  FP4MOE_CHECK(!a.batch.empty() && !a.ctx.empty() && a.iters >= 1, "bench step: --batch / --ctx empty or --iters < 1");
  const int64_t max_b = *std::max_element(a.batch.begin(), a.batch.end());
  const int64_t max_p = a.prefill.empty() ? 1 : *std::max_element(a.prefill.begin(), a.prefill.end());
  const int64_t max_l = std::max(*std::max_element(a.ctx.begin(), a.ctx.end()), max_p);
  engine::gpu::RunnerOptions ro;
  ro.max_requests = max_b;
  ro.max_tokens = std::max(max_b, max_p);
  ro.max_context = max_l + 1;
  ro.mem_fraction_static = a.mem_fraction_static;
  ro.cuda_graph_max_bs = max_b;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = engine::gpu::GpuRunner::load(a.model, ro);
  fmt::print("start-up (load + plan + graphs): {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  cudaStream_t s = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamCreate(&s));
  const cuda::bench::Ceilings ceil = cuda::bench::measure_ceilings(s, 5);
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  fmt::print("ceilings: copy {:.0f} GB/s, BF16 {:.0f} TFLOP/s\n", ceil.copy_gbps, ceil.bf16_tflops);
  const int64_t V = r->config().vocab, ps = r->page_size();
  auto time_step = [&](const engine::gpu::StepInput& in, int iters) {
    r->step(in, {});
    const auto a0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) r->step(in, {});
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a0).count() / iters;
  };
  fmt::print("| decode B | ctx | ms/step | tok/s | floor ms (all weights + KV) | x floor | graph |\n|---|---|---|---|---|---|---|\n");
  for (int64_t L : a.ctx)
    for (int64_t B : a.batch) {
      const int64_t per = (L + ps - 1) / ps;
      if (B * per > r->free_pages()) {
        fmt::print("| {} | {} | skipped: the KV pool holds {} tokens | | | | |\n", B, L, r->num_pages() * ps);
        continue;
      }
      std::vector<int32_t> tok(static_cast<size_t>(B), 7), qo, pp{0}, pi, rows;
      std::vector<int32_t> pos(static_cast<size_t>(B), static_cast<int32_t>(L - 1));
      std::vector<int32_t> len(static_cast<size_t>(B), static_cast<int32_t>(L));
      for (int64_t b = 0; b <= B; ++b) qo.push_back(int32_t(b));
      std::vector<int32_t> pages = r->alloc_pages(B * per);
      for (int64_t b = 0; b < B; ++b) {
        pi.insert(pi.end(), pages.begin() + b * per, pages.begin() + (b + 1) * per);
        pp.push_back(int32_t(pi.size()));
        rows.push_back(int32_t(b));
      }
      engine::gpu::StepInput in;
      in.tokens = tok.data();
      in.batch = {B, B, qo.data(), pos.data(), len.data(), pp.data(), pi.data()};
      in.logits_rows = rows;
      const int64_t g0 = r->stats().graph_steps;
      const double ms = time_step(in, a.iters);
      const bool graph = r->stats().graph_steps > g0;
      const double bytes = double(r->weight_bytes()) + double(B * L * r->kv_bytes_per_token());
      const double floor = bytes / (ceil.copy_gbps * 1e9) * 1e3;
      fmt::print("| {} | {} | {:.3f} | {:.0f} | {:.3f} | {:.2f} | {} |\n", B, L, ms, double(B) / ms * 1e3, floor,
                 ms / floor, graph ? "yes" : "eager");
      r->release_pages(pages);
    }
  fmt::print("\n| prefill P | ms | tok/s |\n|---|---|---|\n");
  for (int64_t P : a.prefill) {
    const int64_t per = (P + ps - 1) / ps;
    if (per > r->free_pages()) continue;
    std::vector<int32_t> tok(static_cast<size_t>(P)), pos(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) tok[size_t(i)] = int32_t(7 + i * 37 % (V - 7)), pos[size_t(i)] = int32_t(i);
    std::vector<int32_t> pages = r->alloc_pages(per);
    const int32_t qo[2] = {0, int32_t(P)}, len[1] = {int32_t(P)}, pp[2] = {0, int32_t(per)};
    engine::gpu::StepInput in;
    in.tokens = tok.data();
    in.batch = {1, P, qo, pos.data(), len, pp, pages.data()};
    in.logits_rows = {int32_t(P - 1)};
    const double ms = time_step(in, std::max(1, a.iters / 4));
    fmt::print("| {} | {:.2f} | {:.0f} |\n", P, ms, double(P) / ms * 1e3);
    r->release_pages(pages);
  }
  fmt::print("\nnot measured yet: per-stage breakdown, K decode steps per launch (src/engine/gpu/README.md)\n");
  return 0;
}
#endif

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchStepArgs>();
  app.add_option("--model", a->model, "checkpoint folder (e.g. make-synthetic --preset glm5-layer)")->required();
  app.add_option("--batch", a->batch, "decode batch sizes")->delimiter(',');
  app.add_option("--ctx", a->ctx, "decode context lengths")->delimiter(',');
  app.add_option("--prefill", a->prefill, "prefill lengths (one request)")->delimiter(',');
  app.add_option("--iters", a->iters, "timed steps per point")->capture_default_str();
  app.add_option("--mem-fraction-static", a->mem_fraction_static, "share of the device for weights + workspace + KV")
      ->capture_default_str();
  run = [a] {
#if defined(FP4MOE_HAVE_GPU_RUNNER)
    return run_bench_step(*a);
#else
    FP4MOE_FAIL("bench step: this fp4moe was built without CUDA (configure with nvcc available)");
    return 1;
#endif
  };
}

const cli::Registrar reg{"bench step", "Time the GPU runner's decode and prefill steps on a checkpoint", setup};

}  // namespace
}  // namespace fp4moe::cli
