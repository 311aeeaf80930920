// fp4moe bench moe: the GPU MoE layer end to end at GLM-5 dimensions (H 6144, I 2048,
// 256 experts, top-8, one shared expert of 2048), random NVFP4 weights (moe/random_layer).
//
// Per T: eager time of the whole layer, CUDA-graph replay time (moe/moe_runner.hpp), per-stage
// breakdown with CUDA events (router, permute, GEMM1, GEMM2, shared, combine; with the shared
// expert folded into the routed GEMMs — the default, see moe/moe_layer_cuda.hpp — its work is
// inside gemm1/gemm2 and "shared" prints '-'; --separate-shared runs it as its own stage), the
// host time of one forward() call (enqueue only), the experts hit, the byte floor (hit
// experts' gate_up + down weights incl. block scales, the shared expert, the FP32 router,
// activations in/out, at the copy bandwidth measured in this run) and the compute floor
// (2·flops at the BF16 dense rate measured in this run by cuBLASLt). Eager and graph times:
// cuda/bench's cold-L2 timer (256 MiB written before every timed run; median); the input
// rotates over 4 random batches (different experts hit). JSON (with the per-expert token
// counts, which bench/torch_moe.py replays) and a table.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/error.hpp"

#if defined(FP4MOE_HAVE_CUDA_MOE)
#include <cuda_runtime_api.h>

#include "cuda/bench/bench_util.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "moe/moe_layer_cuda.hpp"
#include "moe/moe_runner.hpp"
#include "moe/random_layer.hpp"
#endif

namespace fp4moe {
namespace {

struct BenchMoeArgs {
  std::vector<int64_t> tokens{1, 8, 32, 128, 512, 2048, 8192};
  int iters = 20;
  uint64_t seed = 1;
  int64_t experts = 256;
  std::string json;
  std::string l2_flush = "write";
  int64_t graph_max_tokens = 512;
  std::string gemm = "auto";
  bool w4a4 = false;
  bool separate_shared = false;
};

#if defined(FP4MOE_HAVE_CUDA_MOE)

using cuda::bench::median;

// Host time of one forward() call (enqueue only, nothing waited for): the median over `calls`
// calls, the stream drained every 8 calls outside the timed window so the launch queue never
// fills (a full queue would time the GPU, not the host).
double host_us_per_forward(const MoeLayerCuda& layer, const MoeLayerRunner& runner, const uint16_t* x, int64_t T,
                           float* out, int calls) {
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    if (i % 8 == 0) FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
    const auto t0 = std::chrono::steady_clock::now();
    layer.forward(x, T, out, runner.workspace(), runner.stream());
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
  return median(us);
}

int run_bench_moe(const BenchMoeArgs& args) {
  FP4MOE_CHECK(cuda::device_available(), "bench moe needs a CUDA GPU, and none is visible");
  FP4MOE_CHECK(!args.tokens.empty(), "bench moe: --tokens is empty");
  for (int64_t t : args.tokens) FP4MOE_CHECK(t >= 1 && t <= 65536, "bench moe: T = {} outside 1..65536", t);
  FP4MOE_CHECK(args.iters >= 1, "bench moe: --iters {} < 1", args.iters);
  const auto flush = cuda::bench::l2_flush_from(args.l2_flush);
  const cuda::DeviceInfo& dev = cuda::current_device();

  MoeConfig cfg = moe::glm5_moe_config();
  cfg.num_experts = args.experts;
  const int64_t Tmax = *std::max_element(args.tokens.begin(), args.tokens.end());
  MoeCudaOptions opt;
  opt.max_tokens = int(Tmax);
  opt.gemm = moe_gemm_path_from_name(args.gemm, "bench moe: --gemm ");
  opt.w4a4 = args.w4a4;
  opt.fold_shared = !args.separate_shared;
  const auto layer = MoeLayerCuda::random(cfg, opt, args.seed);
  MoeLayerRunner runner(*layer, Tmax);
  const cudaStream_t st = runner.stream();
  const cuda::bench::Ceilings ceil = cuda::bench::measure_ceilings(st);
  fmt::print("GPU {} ({} SMs): copy {:.0f} GB/s, BF16 dense {:.0f} TFLOP/s (measured now)\n", dev.name, dev.sm_count,
             ceil.copy_gbps, ceil.bf16_tflops);
  const int64_t H = cfg.hidden, E = cfg.num_experts, k = cfg.top_k, I = cfg.inter, SI = cfg.shared_inter;
  fmt::print("layer: {}{}\n", layer->describe(), args.w4a4 ? " (W4A4 emulation)" : "");
  const bool folded = layer->shared_folded_pieces() > 0;
  if (folded)
    fmt::print("note: the shared expert is folded into the routed GEMMs ({} always-selected expert(s)): its time is "
               "inside gemm1/gemm2, shared = '-'; the byte floor counts its bytes once\n",
               layer->shared_folded_pieces());

  constexpr int kInputs = 4;
  cuda::DeviceBuffer xs(size_t(kInputs * Tmax * H) * 2), outb(size_t(Tmax * H) * 4);
  cuda::bench::fill_random_bf16(xs.ptr(), size_t(kInputs * Tmax * H), args.seed + 5, 1.0f, st);
  float* out = outb.as<float>();
  auto x_of = [&](int i) { return xs.as<const uint16_t>() + size_t(i % kInputs) * size_t(Tmax * H); };
  cuda::bench::ColdL2Timer timer(st, flush);

  nlohmann::json rows = nlohmann::json::array();
  fmt::print("| T | hit | eager ms | graph ms | graph x | host us | router | permute | gemm1 | gemm2 | shared | "
             "combine | byte floor ms | compute floor ms | x floor | overhead % |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t T : args.tokens) {
    // Routing of each input: experts hit and per-expert counts (outside timing).
    double hit_sum = 0;
    std::vector<int32_t> counts0(static_cast<size_t>(E));
    for (int i = 0; i < kInputs; ++i) {
      runner.forward(x_of(i), T, out);
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(st));
      std::vector<int32_t> off(size_t(E + 1));
      FP4MOE_CUDA_CHECK(
          cudaMemcpy(off.data(), runner.routing(T).expert_offsets, off.size() * 4, cudaMemcpyDeviceToHost));
      int hit = 0;
      for (int64_t e = 0; e < E; ++e) {
        hit += off[size_t(e) + 1] > off[size_t(e)];
        if (i == 0) counts0[size_t(e)] = off[size_t(e) + 1] - off[size_t(e)];
      }
      hit_sum += hit;
    }
    const double hit = hit_sum / kInputs;
    const int iters = T >= 2048 ? std::max(3, args.iters / 4) : args.iters;
    int call = 0;
    const double eager = timer.time([&] { runner.forward(x_of(call++), T, out); }, iters, 2).median_us * 1e-3;
    const double host_us = host_us_per_forward(*layer, runner, x_of(0), T, out, 200);

    std::array<std::vector<double>, kNumMoeStages> stage;
    for (int i = 0; i < iters; ++i) {
      const auto ms = runner.forward_timed(x_of(i), T, out);
      for (int s = 0; s < kNumMoeStages; ++s) stage[size_t(s)].push_back(ms[size_t(s)]);
    }
    std::array<double, kNumMoeStages> sm{};
    for (int s = 0; s < kNumMoeStages; ++s) sm[size_t(s)] = median(stage[size_t(s)]);

    double graph = 0;
    if (T <= args.graph_max_tokens) {
      FP4MOE_CUDA_CHECK(
          cudaMemcpyAsync(runner.graph_input(), x_of(0), size_t(T * H) * 2, cudaMemcpyDeviceToDevice, st));
      runner.capture_graph(T);
      graph = timer.time([&] { runner.replay_graph(T); }, args.iters, 3).median_us * 1e-3;
    }

    const double bytes = hit * double(layer->expert_bytes()) + double(layer->shared_bytes()) +
                         double(layer->router_bytes()) + double(T * H) * (2 + 4);
    const double flops = 2.0 * double(T) * (double(k) * (2.0 * I * H + double(H) * I) + 2.0 * SI * H +
                                            double(H) * SI + double(E) * H);
    const double byte_floor = bytes / (ceil.copy_gbps * 1e9) * 1e3;
    const double compute_floor = flops / (ceil.bf16_tflops * 1e12) * 1e3;
    const double floor = std::max(byte_floor, compute_floor);
    const double gemms = sm[size_t(MoeStage::Gemm1)] + sm[size_t(MoeStage::Gemm2)];
    const double glue = sm[size_t(MoeStage::Router)] + sm[size_t(MoeStage::Permute)] + sm[size_t(MoeStage::Combine)];
    fmt::print("| {} | {:.1f} | {:.4f} | {} | {} | {:.1f} | {:.4f} | {:.4f} | {:.4f} | {:.4f} | {} | {:.4f} | {:.4f} | "
               "{:.4f} | {:.2f} | {:.1f} |\n",
               T, hit, eager, graph > 0 ? fmt::format("{:.4f}", graph) : "-",
               graph > 0 ? fmt::format("{:.2f}", eager / graph) : "-", host_us, sm[0], sm[1], sm[2], sm[3],
               folded ? std::string("-") : fmt::format("{:.4f}", sm[4]), sm[5], byte_floor, compute_floor,
               eager / floor, 100.0 * glue / std::max(gemms, 1e-9));
    nlohmann::json r;
    r["tokens"] = T;
    r["experts_hit"] = hit;
    r["eager_ms"] = eager;
    r["graph_ms"] = graph > 0 ? nlohmann::json(graph) : nlohmann::json(nullptr);
    r["graph_speedup"] = graph > 0 ? nlohmann::json(eager / graph) : nlohmann::json(nullptr);
    r["host_us_per_forward"] = host_us;
    for (int s = 0; s < kNumMoeStages; ++s) r["stages_ms"][moe_stage_name(MoeStage(s))] = sm[size_t(s)];
    if (folded) r["stages_ms"]["shared"] = nullptr;  // inside gemm1 / gemm2
    r["shared_folded_pieces"] = layer->shared_folded_pieces();
    r["weight_and_act_bytes"] = bytes;
    r["flops"] = flops;
    r["byte_floor_ms"] = byte_floor;
    r["compute_floor_ms"] = compute_floor;
    r["ratio_to_floor"] = eager / floor;
    r["glue_over_gemms"] = glue / std::max(gemms, 1e-9);
    r["iters"] = iters;
    r["gemm_configs"] = layer->gemm_configs(T);
    r["expert_counts"] = counts0;
    rows.push_back(r);
  }

  if (!args.json.empty()) {
    nlohmann::json j;
    j["bench"] = "moe";
    j["gpu"] = dev.name;
    j["sms"] = dev.sm_count;
    j["copy_gbps"] = ceil.copy_gbps;
    j["bf16_tflops"] = ceil.bf16_tflops;
    j["timing"] = "cold L2 (256 MiB written before every timed run), median";
    j["config"] = {{"hidden", H}, {"inter", I}, {"experts", E}, {"top_k", k}, {"shared_inter", SI},
                   {"weights", "nvfp4"}, {"routing", "sigmoid+bias, n_group 1, routed_scaling 2.5"}};
    j["layer"] = layer->describe();
    j["w4a4"] = args.w4a4;
    j["rows"] = rows;
    std::ofstream f(args.json);
    FP4MOE_CHECK(f.good(), "bench moe: cannot write {}", args.json);
    f << j.dump(2) << "\n";
    fmt::print("wrote {}\n", args.json);
  }
  return 0;
}

#endif  // FP4MOE_HAVE_CUDA_MOE

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchMoeArgs>();
  app.add_option("--tokens", a->tokens, "token counts T (comma separated)")->delimiter(',');
  app.add_option("--iters", a->iters, "timed repetitions per T (median; a quarter for T >= 2048)");
  app.add_option("--seed", a->seed, "seed of the random layer and inputs");
  app.add_option("--experts", a->experts, "routed experts (GLM-5: 256)");
  app.add_option("--graph-max-tokens", a->graph_max_tokens, "capture and time CUDA graphs for T up to this");
  app.add_option("--json", a->json, "write the results as JSON here");
  cli::add_l2_flush_option(app, a->l2_flush);
  app.add_option("--gemm", a->gemm, "grouped GEMM path: auto (by the GPU's arch) | generic | sm90 | sm1xx (Blackwell, W4A4; compiled, not run)");
  app.add_flag("--w4a4", a->w4a4, "NVFP4 activation emulation (sm90 path)");
  app.add_flag("--separate-shared", a->separate_shared,
               "run the shared expert as its own GEMMs (the fallback path) instead of folding it into the routed ones");
  run = [a] {
#if defined(FP4MOE_HAVE_CUDA_MOE)
    return run_bench_moe(*a);
#else
    FP4MOE_FAIL("bench moe: this fp4moe was built without CUDA (configure with nvcc available)");
    return 1;
#endif
  };
}

const cli::Registrar reg{"bench moe", "Time the GPU MoE layer at GLM-5 dimensions (floors, stages, graphs)", setup};

}  // namespace
}  // namespace fp4moe
