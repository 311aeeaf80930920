// `fp4moe bench gemm`: the MoE grouped GEMM benchmark at GLM-5 shapes.
//
// Per op (gate_up: N=4096 K=6144, SiLU(gate)·up epilogue; down: N=6144 K=2048, routing
// weight row scale), E=256, top-8, and per T tokens: the routing counts of T tokens (top-8 of
// random logits, generator shared with bench/torch_grouped_mm.py, see routing_counts), then
// every config: the sm90 family (candidate_configs, or default_config with --configs best),
// Generic, and the baselines dequantize + cuBLASLt / grouped cuBLAS. Each is timed cold-L2
// (256 MiB memset before every timed run; median of --iters). Reports µs, TFLOP/s, GB/s of
// the bytes needed (hit experts' FP4 weights + scales + globals, x in, y out), % of the copy
// bandwidth and BF16 peak measured in the same run, ratios to the cuBLAS baseline and to
// torch._grouped_mm (from --torch-json), and each config's error against Generic.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"

#if defined(FP4MOE_HAVE_CUDA)
#include "cuda/bench/bench_util.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/moe_gemm/dequant_cublas.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"
#endif

namespace fp4moe::cli {
namespace {

struct BenchOptions {
  std::string op = "both";
  std::vector<int> tokens = {1, 8, 32, 128, 512, 2048, 8192, 16384};
  std::string json_path, torch_json_path;
  std::string l2_flush = "write";
  std::string configs = "all";
  int iters = 20;
  uint64_t seed = 0x5EED;
  bool check = true;
  bool routing_only = false;
};

// ---- routing shared with bench/torch_grouped_mm.py -------------------------------------
// key(t, e) = mix64(seed * C1 + (t * E + e) * C2 + 1) (all mod 2^64); each token takes the
// 8 experts with the largest keys. Since a normal logit is a monotone function of a uniform
// one, this is exactly top-8 of i.i.d. random normal logits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<int> routing_counts(int tokens, int experts, int top_k, uint64_t seed) {
  std::vector<int> counts(static_cast<size_t>(experts), 0);
  std::vector<std::pair<uint64_t, int>> keys(static_cast<size_t>(experts));
  const uint64_t base = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) {
      const uint64_t idx = uint64_t(t) * uint64_t(experts) + uint64_t(e);
      keys[size_t(e)] = {mix64(base + idx * 0xD1B54A32D192ED03ull), -e};  // ties: lower id first
    }
    std::partial_sort(keys.begin(), keys.begin() + top_k, keys.end(), std::greater<>());
    for (int i = 0; i < top_k; ++i) ++counts[size_t(-keys[size_t(i)].second)];
  }
  return counts;
}

struct OpShape {
  std::string name;
  int n = 0, k = 0;
  bool silu = false;  // else RowScale
};

std::string fmt_ratio(double v) { return v > 0 ? fmt::format("{:.2f}x", v) : "-"; }

#if defined(FP4MOE_HAVE_CUDA)
using namespace fp4moe::cuda;

struct ConfigResult {
  std::string name, family;  // family: sm90 | generic | cublas
  double us = 0, tflops = 0, gbps = 0, rel_vs_generic = -1;
  int iters = 0;
  std::string error;
  std::vector<uint16_t> out;  // first outputs, for the cross-check (freed after it)
};

std::map<std::pair<std::string, int>, nlohmann::json> read_torch_json(const std::string& path) {
  std::map<std::pair<std::string, int>, nlohmann::json> out;
  if (path.empty()) return out;
  std::ifstream f(path);
  FP4MOE_CHECK(f.good(), "cannot open --torch-json {}", path);
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    FP4MOE_FAIL("--torch-json {}: not valid JSON ({})", path, e.what());
  }
  for (const auto& r : j.value("results", nlohmann::json::array()))
    out[{r.value("op", ""), r.value("T", 0)}] = r;
  return out;
}

double rel_error(const std::vector<uint16_t>& a, const std::vector<uint16_t>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    const double x = bf16_to_float(a[i]), r = bf16_to_float(ref[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - r) * (x - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int run_bench(const BenchOptions& opt) {
  FP4MOE_CHECK(opt.op == "gate_up" || opt.op == "down" || opt.op == "both", "--op must be gate_up, down or both");
  FP4MOE_CHECK(opt.configs == "all" || opt.configs == "best", "--configs must be all or best");
  FP4MOE_CHECK(opt.iters >= 1, "--iters must be >= 1");
  const auto flush = bench::l2_flush_from(opt.l2_flush);
  for (int t : opt.tokens) FP4MOE_CHECK(t >= 1 && t <= 65536, "--tokens: {} outside [1, 65536]", t);
  const auto torch = read_torch_json(opt.torch_json_path);
  FP4MOE_CHECK(device_available(), "bench gemm needs a CUDA GPU");
  constexpr int kExperts = 256, kTopK = 8;

  const DeviceInfo& dev = current_device();
  const int sm = dev.cc;
  cudaStream_t stream;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const bench::Ceilings ceil = bench::measure_ceilings(stream);
  std::printf("device: %s (sm_%d)  copy %.0f GB/s (2 GiB D2D, read+write)  bf16 %.0f TFLOP/s (cuBLASLt 8192^3)\n",
              dev.name.c_str(), sm, ceil.copy_gbps, ceil.bf16_tflops);

  std::vector<OpShape> ops;
  if (opt.op != "down") ops.push_back({"gate_up", 4096, 6144, true});
  if (opt.op != "gate_up") ops.push_back({"down", 6144, 2048, false});
  const int max_t = *std::max_element(opt.tokens.begin(), opt.tokens.end());
  const int64_t max_rows = int64_t(max_t) * kTopK;

  nlohmann::json jops = nlohmann::json::array();
  bench::ColdL2Timer timer(stream, flush);
  for (const OpShape& op : ops) {
    MoeGemmDesc d;
    d.num_experts = kExperts;
    d.n = op.n;
    d.k = op.k;
    d.max_tokens = int(max_rows);
    d.weight = WeightFormat::NVFP4;
    d.epilogue = op.silu ? Epilogue::SiluMul : Epilogue::RowScale;
    const int n_out = op.silu ? op.n / 2 : op.n;

    // Random NVFP4 experts on the device, linear layout (packed | scales | globals).
    ExpertStack stack;
    stack.format = WeightFormat::NVFP4;
    stack.num_experts = kExperts;
    stack.n = op.n;
    stack.k = op.k;
    const size_t packed_b = size_t(kExperts) * op.n * (op.k / 2), scales_b = size_t(kExperts) * op.n * (op.k / 16);
    DeviceBuffer wbuf(packed_b + scales_b + kExperts * 4 + 256);
    auto* wbase = wbuf.as<uint8_t>();
    bench::fill_random_u8(wbase, packed_b, 11, 0, 255, stream);
    bench::fill_random_u8(wbase + packed_b, scales_b, 12, 0x28, 0x50, stream);  // E4M3 0.25 .. 8
    auto* gdev = reinterpret_cast<float*>(wbase + (packed_b + scales_b + 255) / 256 * 256);
    bench::fill_random_f32(gdev, kExperts, 13, 0.5e-3f, 2e-3f, stream);
    std::vector<float> ghost(kExperts);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(ghost.data(), gdev, kExperts * 4, cudaMemcpyDeviceToHost, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    LinearFp4Weights lw{WeightFormat::NVFP4, kExperts, op.n, op.k, wbase, wbase + packed_b, gdev, ghost.data()};
    const size_t expert_bytes = size_t(op.n) * (op.k / 2) + size_t(op.n) * (op.k / 16) + 4;

    // The sm90 configs (and its re-laid weights, built from a host copy).
    std::vector<TileConfig> sm90_cfgs;
    for (const TileConfig& c : candidate_configs(d))
      if (can_implement(d, c, sm).empty()) sm90_cfgs.push_back(c);
    std::optional<DeviceExpertWeights> sm90_w;
    if (!sm90_cfgs.empty()) {
      stack.packed.resize(packed_b);
      stack.scales.resize(scales_b);
      stack.global_scale = ghost;
      FP4MOE_CUDA_CHECK(cudaMemcpy(stack.packed.data(), wbase, packed_b, cudaMemcpyDeviceToHost));
      FP4MOE_CUDA_CHECK(cudaMemcpy(stack.scales.data(), wbase + packed_b, scales_b, cudaMemcpyDeviceToHost));
      sm90_w.emplace(upload_weights(stack, d.epilogue, stream));
      stack.packed = {};
      stack.scales = {};
    }
    size_t sm90_ws = 0;
    for (const TileConfig& c : sm90_cfgs) sm90_ws = std::max(sm90_ws, workspace_bytes(d, c));
    DeviceBuffer ws(std::max<size_t>(sm90_ws, 16));

    DeviceBuffer x(size_t(max_rows) * op.k * 2), y(size_t(max_rows) * op.n * 2), rs(size_t(max_rows) * 4),
        offs(size_t(kExperts + 1) * 4);
    bench::fill_random_bf16(x.ptr(), size_t(max_rows) * op.k, 14, 1.0f, stream);
    bench::fill_random_f32(rs.as<float>(), size_t(max_rows), 15, 0.05f, 1.0f, stream);
    DequantCublasGemm cublas_lt(d);
    DequantCublasOptions gopt;
    gopt.mode = DequantCublasOptions::Mode::GroupedBatched;
    DequantCublasGemm cublas_grouped(d, gopt);

    std::printf("\n%s: N=%d K=%d E=%d top-%d, epilogue %s, NVFP4; %zu sm90 configs\n", op.name.c_str(), op.n, op.k,
                kExperts, kTopK, op.silu ? "SiLU(gate)*up" : "row scale", sm90_cfgs.size());
    std::printf("| %-6s | %-5s | %-4s | %-34s | %10s | %8s | %8s | %6s | %6s | %8s | %8s | %9s |\n", "op", "T",
                "hit", "config", "us", "TFLOP/s", "GB/s", "%BW", "%peak", "x cublas", "x torch", "err/gen");
    nlohmann::json jres = nlohmann::json::array();
    for (int t : opt.tokens) {
      const std::vector<int> counts = routing_counts(t, kExperts, kTopK, opt.seed);
      std::vector<int32_t> off(kExperts + 1, 0);
      for (int e = 0; e < kExperts; ++e) off[size_t(e + 1)] = off[size_t(e)] + counts[size_t(e)];
      const int m_total = off.back();
      const int hit = int(std::count_if(counts.begin(), counts.end(), [](int c) { return c > 0; }));
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(offs.ptr(), off.data(), off.size() * 4, cudaMemcpyHostToDevice, stream));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const double bytes = double(hit) * double(expert_bytes) + double(m_total) * op.k * 2 + double(m_total) * n_out * 2;
      const double flops = 2.0 * m_total * double(op.n) * op.k;

      MoeGemmArgs a;
      a.x = x.ptr();
      a.expert_offsets = static_cast<const int32_t*>(offs.ptr());
      a.row_scale = rs.as<const float>();
      a.y = y.ptr();
      a.m_total = m_total;
      a.stream = stream;
      a.workspace = sm90_ws ? ws.ptr() : nullptr;

      const size_t check_elems = std::min<size_t>(size_t(m_total) * n_out, size_t(64) << 20);
      std::vector<ConfigResult> results;
      auto measure = [&](const std::string& name, const std::string& family, const std::function<void()>& fn) {
        ConfigResult r;
        r.name = name;
        r.family = family;
        try {
          FP4MOE_CUDA_CHECK(cudaMemsetAsync(y.ptr(), 0xFF, size_t(m_total) * n_out * 2, stream));
          fn();
          FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
          if (opt.check) {
            r.out.resize(check_elems);
            FP4MOE_CUDA_CHECK(cudaMemcpy(r.out.data(), y.ptr(), check_elems * 2, cudaMemcpyDeviceToHost));
          }
          const auto tr = timer.time(fn, opt.iters);
          r.us = tr.median_us;
          r.iters = tr.iters;
          r.tflops = flops / (r.us * 1e-6) / 1e12;
          r.gbps = bytes / (r.us * 1e-6) / 1e9;
        } catch (const Error& e) {
          r.error = e.what();
          cudaGetLastError();
        }
        results.push_back(std::move(r));
      };

      // Order: baselines, sm90, then Generic (untested kernels last: a sticky fault must not
      // lose the numbers before it). Each config's output is checked against Generic's
      // (against cuBLASLt's when Generic failed) after all ran.
      measure(fmt::format("dequant+cublaslt ({} slots)", cublas_lt.slots()), "cublas",
              [&] { cublas_lt.run(lw, a, off); });
      measure(fmt::format("dequant+cublas-grouped ({} slots)", cublas_grouped.slots()), "cublas",
              [&] { cublas_grouped.run(lw, a, off); });

      std::vector<TileConfig> run_cfgs = sm90_cfgs;
      if (opt.configs == "best" && !sm90_cfgs.empty())
        run_cfgs = {default_config(d, double(m_total) / std::max(hit, 1))};
      for (const TileConfig& c : run_cfgs)
        measure(to_string(c), "sm90", [&] { run_moe_gemm(d, c, *sm90_w, a); });
      measure(fmt::format("generic {}x{}x{}", generic_tile_config().block_m, generic_tile_config().block_n,
                          generic_tile_config().block_k),
              "generic", [&] { run_generic_grouped_gemm(d, lw, a); });
      std::string check_ref;
      {
        const ConfigResult* ref = nullptr;
        for (const auto& r : results)
          if (r.family == "generic" && r.error.empty() && !r.out.empty()) ref = &r;
        for (const auto& r : results)
          if (!ref && r.family == "cublas" && r.error.empty() && !r.out.empty()) ref = &r;
        if (ref) check_ref = ref->name;
        for (auto& r : results) {
          if (ref && r.error.empty() && !r.out.empty()) r.rel_vs_generic = rel_error(r.out, ref->out);
        }
        for (auto& r : results) r.out = {};
      }
      // Ours = the fastest sm90 config (Generic when none ran); baseline = the faster cuBLAS mode.
      auto best_of = [&](const std::string& fam) -> const ConfigResult* {
        const ConfigResult* b = nullptr;
        for (const auto& r : results)
          if (r.family == fam && r.error.empty() && (!b || r.us < b->us)) b = &r;
        return b;
      };
      const ConfigResult* ours = best_of("sm90");
      if (!ours) ours = best_of("generic");
      const ConfigResult* base = best_of("cublas");
      double torch_us = 0, torch_epi_us = 0;
      if (auto it = torch.find({op.name, t}); it != torch.end()) {
        torch_us = it->second.value("us", 0.0);
        torch_epi_us = it->second.value("us_with_epilogue", 0.0);
        if (it->second.contains("m_total") && it->second["m_total"].get<int>() != m_total)
          std::printf("warning: torch JSON has m_total %d for %s T=%d, expected %d\n",
                      it->second["m_total"].get<int>(), op.name.c_str(), t, m_total);
        if (it->second.contains("hit") && it->second["hit"].get<int>() != hit)
          std::printf("warning: torch JSON routing hits %d experts for %s T=%d, we hit %d\n",
                      it->second["hit"].get<int>(), op.name.c_str(), t, hit);
      }
      nlohmann::json jcfg = nlohmann::json::array();
      for (const ConfigResult& r : results) {
        const bool show = opt.configs == "all" || &r == ours || &r == base;
        if (show && r.error.empty()) {
          std::printf("| %-6s | %5d | %4d | %-34s | %10.1f | %8.1f | %8.0f | %5.1f%% | %5.1f%% | %8s | %8s | %9s |\n",
                      op.name.c_str(), t, hit, r.name.substr(0, 34).c_str(), r.us, r.tflops, r.gbps,
                      100.0 * r.gbps / ceil.copy_gbps, 100.0 * r.tflops / ceil.bf16_tflops,
                      fmt_ratio(base ? base->us / r.us : 0).c_str(), fmt_ratio(torch_us > 0 ? torch_us / r.us : 0).c_str(),
                      r.rel_vs_generic >= 0 ? fmt::format("{:.1e}", r.rel_vs_generic).c_str() : "-");
        } else if (show) {
          std::printf("| %-6s | %5d | %4d | %-34s | failed: %s\n", op.name.c_str(), t, hit, r.name.substr(0, 34).c_str(),
                      r.error.c_str());
        }
        jcfg.push_back({{"name", r.name}, {"family", r.family}, {"us", r.us}, {"tflops", r.tflops}, {"gbps", r.gbps},
                        {"pct_copy_bw", 100.0 * r.gbps / ceil.copy_gbps}, {"pct_bf16_peak", 100.0 * r.tflops / ceil.bf16_tflops},
                        {"iters", r.iters}, {"rel_vs_generic", r.rel_vs_generic}, {"error", r.error}});
      }
      nlohmann::json jr = {{"T", t}, {"m_total", m_total}, {"hit", hit}, {"bytes", bytes}, {"flops", flops},
                           {"byte_floor_us", bytes / (ceil.copy_gbps * 1e9) * 1e6},
                           {"compute_floor_us", flops / (ceil.bf16_tflops * 1e12) * 1e6}, {"check_ref", check_ref},
                           {"configs", jcfg}};
      if (ours) jr["ours"] = {{"name", ours->name}, {"us", ours->us}};
      if (base) jr["cublas"] = {{"name", base->name}, {"us", base->us}};
      if (torch_us > 0) jr["torch"] = {{"us", torch_us}, {"us_with_epilogue", torch_epi_us}};
      if (ours && base) jr["speedup_vs_cublas"] = base->us / ours->us;
      if (ours && torch_us > 0) jr["speedup_vs_torch"] = torch_us / ours->us;
      jres.push_back(jr);
    }
    jops.push_back({{"op", op.name}, {"n", op.n}, {"k", op.k}, {"experts", kExperts}, {"top_k", kTopK},
                    {"epilogue", op.silu ? "silu_mul" : "row_scale"}, {"results", jres}});
  }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(stream));

  if (!opt.json_path.empty()) {
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    const char* commit = std::getenv("FP4MOE_COMMIT");
    nlohmann::json j = {{"bench", "gemm"}, {"date", date}, {"gpu", dev.name}, {"sm", sm},
                        {"commit", commit ? commit : ""}, {"seed", opt.seed}, {"iters", opt.iters},
                        {"method", "cold L2 (256 MiB memset before each timed run), median of CUDA-event times"},
                        {"routing", "top-8 of random logits, splitmix64 keys (bench/torch_grouped_mm.py)"},
                        {"ceilings", {{"copy_gbps", ceil.copy_gbps}, {"bf16_tflops", ceil.bf16_tflops},
                                      {"copy_bytes", ceil.copy_bytes}, {"gemm_size", ceil.gemm_size}}},
                        {"ops", jops}};
    std::ofstream f(opt.json_path);
    FP4MOE_CHECK(f.good(), "cannot write --json {}", opt.json_path);
    f << j.dump(2) << "\n";
    std::printf("\nwrote %s\n", opt.json_path.c_str());
  }
  return 0;
}
#endif  // FP4MOE_HAVE_CUDA

// --routing-only: the per-expert counts of every T, one line each ("T: c0 c1 ... c255"),
// no GPU needed (tests compare them with bench/torch_grouped_mm.py's).
int print_routing(const BenchOptions& opt) {
  for (int t : opt.tokens) {
    FP4MOE_CHECK(t >= 1 && t <= 65536, "--tokens: {} outside [1, 65536]", t);
    std::string line = fmt::format("{}:", t);
    for (int c : routing_counts(t, 256, 8, opt.seed)) line += fmt::format(" {}", c);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto opt = std::make_shared<BenchOptions>();
  app.add_option("--op", opt->op, "gate_up | down | both")->capture_default_str();
  app.add_option("--tokens", opt->tokens, "token counts T (comma separated)")->delimiter(',')->capture_default_str();
  app.add_option("--json", opt->json_path, "write the results as JSON");
  add_l2_flush_option(app, opt->l2_flush);
  app.add_option("--torch-json", opt->torch_json_path, "JSON of bench/torch_grouped_mm.py (same shapes and routing)");
  app.add_option("--configs", opt->configs, "all: every candidate config; best: the default config only")
      ->capture_default_str();
  app.add_option("--iters", opt->iters, "timed runs per config (median)")->capture_default_str();
  app.add_option("--seed", opt->seed, "routing seed (must match the torch script's)")->capture_default_str();
  app.add_flag("!--no-check", opt->check, "skip the output comparison against Generic");
  app.add_flag("--routing-only", opt->routing_only, "print the routing counts per T and exit (no GPU)");
  run = [opt] {
    if (opt->routing_only) return print_routing(*opt);
#if defined(FP4MOE_HAVE_CUDA)
    return run_bench(*opt);
#else
    FP4MOE_FAIL("bench gemm: this fp4moe was built without CUDA");
    return 1;
#endif
  };
}

Registrar reg{"bench gemm", "Benchmark the MoE grouped GEMM (GLM-5 shapes) against cuBLAS and torch baselines", setup};

}  // namespace
}  // namespace fp4moe::cli
