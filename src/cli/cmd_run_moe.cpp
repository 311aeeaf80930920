// fp4moe run-moe --model DIR --layer L --input IN.safetensors --output OUT.safetensors
//               [--backend cpu|cuda] [--threads N]
//
// One MoE layer's forward pass. Reads `hidden_states` [T, hidden] (BF16 or F32) and writes
// `output` [T, hidden] F32, `topk_ids` [T, k] I32, `topk_weights` [T, k] F32 and
// `router_logits` [T, E] F32 (the logits the routing was computed from). Prints one line:
// tokens, experts hit, time and the weight bytes read per second.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/moe_cpu.hpp"
#include "format/checkpoint.hpp"
#include "format/safetensors.hpp"
#if defined(FP4MOE_HAVE_CUDA_MOE)
#include "moe/moe_runner.hpp"
#endif

namespace fp4moe {
namespace {

struct RunMoeArgs {
  std::string model, input, output, backend = "cpu";
  int64_t layer = -1;
  int threads = 0;
};

// The backends, behind one call. --backend cuda: moe_forward_cuda (moe/moe_runner.hpp) when the
// binary has the CUDA layer.
MoeOutput run_backend(const std::string& backend, const MoeLayerWeights& w, const float* x, int64_t tokens,
                      int threads) {
  if (backend == "cpu") {
    CpuMoeOptions opt;
    opt.threads = threads;
    return moe_forward_cpu(w, x, tokens, opt);
  }
#if defined(FP4MOE_HAVE_CUDA_MOE)
  if (backend == "cuda") return moe_forward_cuda(w, x, tokens);
#endif
  FP4MOE_FAIL("--backend {}: the cuda backend is not built/ready in this binary (use --backend cpu)", backend);
}

// hidden_states [T, hidden] (BF16 or F32) -> float, validated.
std::vector<float> read_hidden_states(const std::string& path, int64_t hidden, int64_t* tokens) {
  std::error_code ec;
  FP4MOE_CHECK(std::filesystem::is_regular_file(path, ec), "{}: no such input file", path);
  const auto f = SafetensorsFile::open(path);
  const TensorInfo* t = f->find("hidden_states");
  FP4MOE_CHECK(t, "{}: no tensor named 'hidden_states' (it must hold [T, {}] BF16 or F32)", path, hidden);
  FP4MOE_CHECK(t->dtype == DType::BF16 || t->dtype == DType::F32,
               "{}: hidden_states has dtype {}, expected BF16 or F32", path, dtype_name(t->dtype));
  FP4MOE_CHECK(t->shape.size() == 2, "{}: hidden_states has {} dimensions, expected 2 ([T, {}])", path,
               t->shape.size(), hidden);
  FP4MOE_CHECK(t->shape[1] == hidden, "{}: hidden_states is [{}, {}], but the model's hidden size is {}", path,
               t->shape[0], t->shape[1], hidden);
  FP4MOE_CHECK(t->shape[0] >= 1, "{}: hidden_states has no tokens (T = 0)", path);
  const int64_t n = t->shape[0] * hidden;
  const auto bytes = f->bytes(*t);
  std::vector<float> x(static_cast<size_t>(n));
  if (t->dtype == DType::F32) {
    std::memcpy(x.data(), bytes.data(), size_t(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      x[size_t(i)] = bf16_to_float(h);
    }
  }
  for (int64_t i = 0; i < n; ++i)
    FP4MOE_CHECK(std::isfinite(x[size_t(i)]), "{}: hidden_states[{}, {}] is not finite ({})", path, i / hidden,
                 i % hidden, x[size_t(i)]);
  *tokens = t->shape[0];
  return x;
}

int run_moe(const RunMoeArgs& a) {
  FP4MOE_CHECK(a.threads >= 0, "--threads {}: must be >= 1 (or 0 for the default)", a.threads);
  std::error_code ec;
  FP4MOE_CHECK(std::filesystem::is_directory(a.model, ec), "{}: no such model directory", a.model);
  const auto t_load = std::chrono::steady_clock::now();
  const auto ck = Checkpoint::open(a.model);
  const MoeLayerWeights w = ck->load_moe_layer(a.layer);
  int64_t T = 0;
  const std::vector<float> x = read_hidden_states(a.input, w.cfg.hidden, &T);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  const int threads = a.threads > 0 ? a.threads : default_num_threads();
  const auto t0 = std::chrono::steady_clock::now();
  const MoeOutput out = run_backend(a.backend, w, x.data(), T, threads);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t K = w.cfg.top_k, H = w.cfg.hidden, E = w.cfg.num_experts;
  FP4MOE_CHECK(out.out.size() == size_t(T * H) && out.routing.topk_ids.size() == size_t(T * K) &&
                   out.routing.topk_weights.size() == size_t(T * K) && out.logits.size() == size_t(T * E),
               "backend {} returned outputs of the wrong size", a.backend);

  SafetensorsWriter writer(a.output);
  writer.set_metadata("producer", "fp4moe run-moe");
  writer.set_metadata("layer", std::to_string(a.layer));
  writer.add("output", DType::F32, {T, H}, out.out);
  writer.add("topk_ids", DType::I32, {T, K}, out.routing.topk_ids);
  writer.add("topk_weights", DType::F32, {T, K}, out.routing.topk_weights);
  writer.add("router_logits", DType::F32, {T, E}, out.logits);
  writer.finish();

  // Weight bytes the layer read: the hit experts, the shared expert, the FP32 router.
  std::vector<char> hit(static_cast<size_t>(E), 0);
  for (int32_t id : out.routing.topk_ids) hit[size_t(id)] = 1;
  int64_t nhit = 0;
  for (char h : hit) nhit += h;
  double bytes = double(nhit) * double(w.w13.weight_bytes_per_expert() + w.w2.weight_bytes_per_expert()) +
                 double(w.router_w.size() * sizeof(float));
  if (w.shared_w13) bytes += double(w.shared_w13->weight_bytes_per_expert() + w.shared_w2->weight_bytes_per_expert());
  fmt::print("run-moe: layer {} of {} ({} experts {}, top-{}), T={} tokens, backend {} ({} threads): {:.2f} ms, "
             "{} experts hit, {:.1f} MB of weights read, {:.2f} GB/s (load {:.2f} s) -> {}\n",
             a.layer, ck->config().architecture, E, weight_format_name(w.w13.format), K, T, a.backend, threads,
             run_s * 1e3, nhit, bytes / 1e6, bytes / run_s / 1e9, load_s, a.output);
  double ss = 0;
  for (float v : out.out) ss += double(v) * v;
  std::string route;
  for (int64_t j = 0; j < K; ++j)
    route += fmt::format("{}{}:{:.3f}", j ? " " : "", out.routing.topk_ids[size_t(j)],
                         out.routing.topk_weights[size_t(j)]);
  fmt::print("run-moe: output rms {:.4g}; token 0 -> experts (id:weight) {}\n", std::sqrt(ss / double(out.out.size())),
             route);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<RunMoeArgs>();
  app.add_option("--model", a->model, "checkpoint folder (config.json + safetensors)")->required();
  app.add_option("--layer", a->layer, "index of a MoE layer of the model")->required();
  app.add_option("--input", a->input, "safetensors file with `hidden_states` [T, hidden] BF16 or F32")->required();
  app.add_option("--output", a->output,
                 "safetensors file to write: `output` [T, hidden] F32, `topk_ids` [T, k] I32, "
                 "`topk_weights` [T, k] F32, `router_logits` [T, E] F32")
      ->required();
  app.add_option("--backend", a->backend, "cpu (default) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", a->threads, "CPU threads (default: FP4MOE_THREADS or all cores)");
  run = [a] { return run_moe(*a); };
}

const cli::Registrar reg{"run-moe", "Run one MoE layer of a checkpoint on hidden states from a safetensors file",
                         setup};

}  // namespace
}  // namespace fp4moe
