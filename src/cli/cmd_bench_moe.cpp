// fp4moe bench moe: the GPU MoE layer end to end at GLM-5 dimensions (H 6144, I 2048,
// 256 experts, top-8, one shared expert of 2048), random NVFP4 weights (moe/random_layer).
//
// Per T: eager time of the whole layer, CUDA-graph replay time, per-stage breakdown with
// CUDA events (router, permute, GEMM1, GEMM2, shared, combine; stages serialised for this;
// with the shared expert folded into the routed GEMMs — the default, see
// moe/moe_layer_cuda.hpp — its work is inside gemm1/gemm2 and "shared" prints '-'; with
// --separate-shared it runs as its own stage, overlapped on a second stream in the eager
// and graph times), the experts hit, the byte floor
// (hit experts' gate_up + down weights incl. block scales, the shared expert, the FP32
// router, activations in/out, at the copy bandwidth measured in this run) and the compute
// floor (2·flops at the BF16 dense rate measured in this run by cuBLAS). Medians over
// --iters runs; the input rotates over 4 random batches (different experts hit). JSON
// (with the per-expert token counts, which bench/torch_moe.py replays) and a table.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/error.hpp"

#if defined(FP4MOE_HAVE_CUDA_MOE)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/bf16.hpp"
#include "cuda/common/cuda_check.hpp"
#include "moe/moe_layer_cuda.hpp"
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
  int64_t graph_max_tokens = 512;
  std::string gemm = "auto";
  bool w4a4 = false;
  bool separate_shared = false;
};

#if defined(FP4MOE_HAVE_CUDA_MOE)

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct EventPair {
  cudaEvent_t a = nullptr, b = nullptr;
  EventPair() {
    FP4MOE_CUDA_CHECK(cudaEventCreate(&a));
    FP4MOE_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~EventPair() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  double ms() const {
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    return t;
  }
};

template <typename F>
double time_median_ms(int iters, cudaStream_t st, F&& body) {
  EventPair ev;
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(ev.a, st));
    body(i);
    FP4MOE_CUDA_CHECK(cudaEventRecord(ev.b, st));
    t.push_back(ev.ms());
  }
  return median(t);
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float f = (float(uint32_t(s >> 40)) / float(1 << 24) * 2.f - 1.f) * 1.7f;  // uniform, rms ~1
    x = float_to_bf16(f);
  }
  return v;
}

// Measured ceilings: D2D copy (read + write bytes / s) and cuBLAS BF16 8192³.
struct Ceilings {
  double copy_gbps = 0, bf16_tflops = 0;
};

Ceilings measure_ceilings(cudaStream_t st) {
  Ceilings c;
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  FP4MOE_CUDA_CHECK(cudaMalloc(&a, bytes));
  FP4MOE_CUDA_CHECK(cudaMalloc(&b, bytes));
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, st));
  for (int i = 0; i < 2; ++i) FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
  const double ms = time_median_ms(10, st, [&](int) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
  });
  c.copy_gbps = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
  // BF16 GEMM 8192³ on random data (the copy buffers hold 3 x 128 MiB matrices).
  const int n = 8192;
  const size_t mat = size_t(n) * n * 2;
  const std::vector<uint16_t> r = random_bf16(size_t(n) * n, 77);
  FP4MOE_CUDA_CHECK(cudaMemcpy(a, r.data(), mat, cudaMemcpyHostToDevice));
  FP4MOE_CUDA_CHECK(cudaMemcpy(static_cast<char*>(a) + mat, r.data(), mat, cudaMemcpyHostToDevice));
  cublasHandle_t h;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
  FP4MOE_CUBLAS_CHECK(cublasSetStream(h, st));
  const float one = 1.f, zero = 0.f;
  auto gemm = [&](int) {
    FP4MOE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n,
                                     static_cast<char*>(a) + mat, CUDA_R_16BF, n, &zero, b, CUDA_R_16BF, n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) gemm(i);
  const double gms = time_median_ms(10, st, gemm);
  c.bf16_tflops = 2.0 * double(n) * n * n / (gms * 1e-3) / 1e12;
  cublasDestroy(h);
  FP4MOE_CUDA_CHECK(cudaFree(a));
  FP4MOE_CUDA_CHECK(cudaFree(b));
  return c;
}

int run_bench_moe(const BenchMoeArgs& args) {
  FP4MOE_CHECK(cuda::device_available(), "bench moe needs a CUDA GPU, and none is visible");
  FP4MOE_CHECK(!args.tokens.empty(), "bench moe: --tokens is empty");
  for (int64_t t : args.tokens) FP4MOE_CHECK(t >= 1 && t <= 65536, "bench moe: T = {} outside 1..65536", t);
  FP4MOE_CHECK(args.iters >= 1, "bench moe: --iters {} < 1", args.iters);
  cudaDeviceProp prop{};
  FP4MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const Ceilings ceil = measure_ceilings(st);
  fmt::print("GPU {} ({} SMs): copy {:.0f} GB/s, BF16 dense {:.0f} TFLOP/s (measured now)\n", prop.name,
             prop.multiProcessorCount, ceil.copy_gbps, ceil.bf16_tflops);

  MoeConfig cfg = moe::glm5_moe_config();
  cfg.num_experts = args.experts;
  const int64_t Tmax = *std::max_element(args.tokens.begin(), args.tokens.end());
  MoeCudaOptions opt;
  opt.max_tokens = int(Tmax);
  FP4MOE_CHECK(args.gemm == "auto" || args.gemm == "generic" || args.gemm == "sm90",
               "bench moe: --gemm {}: expected auto, generic or sm90", args.gemm);
  opt.gemm = args.gemm == "generic" ? MoeGemmPath::Generic : args.gemm == "sm90" ? MoeGemmPath::Sm90 : MoeGemmPath::Auto;
  opt.w4a4 = args.w4a4;
  opt.fold_shared = !args.separate_shared;
  auto layer = MoeLayerCuda::random(cfg, opt, args.seed);
  const int64_t H = cfg.hidden, E = cfg.num_experts, k = cfg.top_k, I = cfg.inter, SI = cfg.shared_inter;
  fmt::print("layer: {}{}\n", layer->describe(), args.w4a4 ? " (W4A4 emulation)" : "");
  const bool folded = layer->shared_folded_pieces() > 0;
  if (folded)
    fmt::print("note: the shared expert is folded into the routed GEMMs ({} always-selected expert(s)): its time is "
               "inside gemm1/gemm2, shared = '-'; the byte floor counts its bytes once\n",
               layer->shared_folded_pieces());

  constexpr int kInputs = 4;
  uint16_t* xs = nullptr;
  float* out = nullptr;
  FP4MOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&xs), size_t(kInputs * Tmax * H) * 2));
  FP4MOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), size_t(Tmax * H) * 4));
  {
    const std::vector<uint16_t> hx = random_bf16(size_t(kInputs * Tmax * H), args.seed + 5);
    FP4MOE_CUDA_CHECK(cudaMemcpy(xs, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  }

  nlohmann::json rows = nlohmann::json::array();
  fmt::print("| T | hit | eager ms | graph ms | graph x | router | permute | gemm1 | gemm2 | shared | combine | "
             "byte floor ms | compute floor ms | x floor | overhead % |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t T : args.tokens) {
    auto x_of = [&](int i) { return xs + size_t(i % kInputs) * size_t(Tmax * H); };
    // Routing of each input: experts hit and per-expert counts (outside timing).
    double hit_sum = 0;
    std::vector<int32_t> counts0(static_cast<size_t>(E));
    for (int i = 0; i < kInputs; ++i) {
      layer->forward(x_of(i), T, H, out, st);
      std::vector<int32_t> off(size_t(E + 1));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(st));
      FP4MOE_CUDA_CHECK(cudaMemcpy(off.data(), layer->expert_offsets(), off.size() * 4, cudaMemcpyDeviceToHost));
      int hit = 0;
      for (int64_t e = 0; e < E; ++e) {
        hit += off[size_t(e) + 1] > off[size_t(e)];
        if (i == 0) counts0[size_t(e)] = off[size_t(e) + 1] - off[size_t(e)];
      }
      hit_sum += hit;
    }
    const double hit = hit_sum / kInputs;
    const int iters = T >= 2048 ? std::max(3, args.iters / 4) : args.iters;
    for (int i = 0; i < 2; ++i) layer->forward(x_of(i), T, H, out, st);
    const double eager = time_median_ms(iters, st, [&](int i) { layer->forward(x_of(i), T, H, out, st); });

    layer->set_stage_timing(true);
    std::array<std::vector<double>, kNumMoeStages> stage;
    for (int i = 0; i < iters; ++i) {
      layer->forward(x_of(i), T, H, out, st);
      const auto ms = layer->last_stage_ms();
      for (int s = 0; s < kNumMoeStages; ++s) stage[size_t(s)].push_back(ms[size_t(s)]);
    }
    layer->set_stage_timing(false);
    std::array<double, kNumMoeStages> sm{};
    for (int s = 0; s < kNumMoeStages; ++s) sm[size_t(s)] = median(stage[size_t(s)]);

    double graph = 0;
    if (T <= args.graph_max_tokens) {
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(layer->graph_input(), x_of(0), size_t(T * H) * 2, cudaMemcpyDeviceToDevice, st));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(st));
      layer->capture_graph(T);
      for (int i = 0; i < 3; ++i) layer->replay_graph(T, st);
      graph = time_median_ms(args.iters, st, [&](int) { layer->replay_graph(T, st); });
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
    fmt::print("| {} | {:.1f} | {:.4f} | {} | {} | {:.4f} | {:.4f} | {:.4f} | {:.4f} | {} | {:.4f} | {:.4f} | {:.4f} | "
               "{:.2f} | {:.1f} |\n",
               T, hit, eager, graph > 0 ? fmt::format("{:.4f}", graph) : "-",
               graph > 0 ? fmt::format("{:.2f}", eager / graph) : "-", sm[0], sm[1], sm[2], sm[3],
               folded ? std::string("-") : fmt::format("{:.4f}", sm[4]), sm[5],
               byte_floor, compute_floor, eager / floor, 100.0 * glue / std::max(gemms, 1e-9));
    nlohmann::json r;
    r["tokens"] = T;
    r["experts_hit"] = hit;
    r["eager_ms"] = eager;
    r["graph_ms"] = graph > 0 ? nlohmann::json(graph) : nlohmann::json(nullptr);
    r["graph_speedup"] = graph > 0 ? nlohmann::json(eager / graph) : nlohmann::json(nullptr);
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
  cudaFree(xs);
  cudaFree(out);
  cudaStreamDestroy(st);

  if (!args.json.empty()) {
    nlohmann::json j;
    j["bench"] = "moe";
    j["gpu"] = prop.name;
    j["sms"] = prop.multiProcessorCount;
    j["copy_gbps"] = ceil.copy_gbps;
    j["bf16_tflops"] = ceil.bf16_tflops;
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
  app.add_option("--gemm", a->gemm, "grouped GEMM path: auto | generic | sm90");
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
