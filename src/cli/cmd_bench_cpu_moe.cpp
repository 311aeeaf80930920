// fp4moe bench cpu-moe: the CPU MoE layer's speed at GLM-5 MoE dimensions, in weight GB/s.
//
// Builds a random NVFP4 layer in memory (random packed bytes and valid block scales; with
// the defaults ~5.4 GB, all 256 experts distinct so nothing is served from cache), runs
// moe_forward_cpu on fresh random tokens each repetition and reports the median time and
// the weight bytes read per second: hit experts' gate_up + down (packed, block scales,
// global scale), the shared expert and the FP32 router.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <ctime>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "cpu/moe_cpu.hpp"

namespace fp4moe {
namespace {

struct BenchArgs {
  std::vector<int64_t> tokens{1, 32};
  int64_t hidden = 6144, inter = 2048, experts = 256, top_k = 8, shared_inter = 2048;
  int reps = 7;
  int threads = 0;
  uint64_t seed = 1;
};

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

ExpertStack random_nvfp4(int64_t E, int64_t n, int64_t k, uint64_t seed, int threads) {
  ExpertStack s;
  s.format = WeightFormat::NVFP4;
  s.num_experts = E;
  s.n = n;
  s.k = k;
  s.packed.resize(size_t(E * n * k / 2));
  s.scales.resize(size_t(E * n * k / 16));
  // Random bytes, filled in parallel in 1 MiB pieces (deterministic per piece).
  auto fill = [&](std::vector<uint8_t>& v, uint64_t salt, bool scale) {
    const int64_t piece = 1 << 20, pieces = int64_t((v.size() + piece - 1) / piece);
    parallel_for(pieces, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        uint64_t st = seed * 1000003 + salt * 7919 + uint64_t(p);
        const size_t end = std::min(v.size(), size_t((p + 1) * piece));
        for (size_t i = size_t(p * piece); i < end; i += 8) {
          const uint64_t r = splitmix(st);
          for (size_t j = 0; j < 8 && i + j < end; ++j) {
            const uint8_t byte = uint8_t(r >> (8 * j));
            v[i + j] = scale ? uint8_t(0x30 + (byte & 0x0F)) : byte;  // E4M3 0.5 .. 1.9
          }
        }
      }
    });
  };
  fill(s.packed, 1 + uint64_t(n), false);
  fill(s.scales, 2 + uint64_t(n), true);
  s.global_scale.assign(size_t(E), float(1.0 / (3.2 * std::sqrt(double(k)))));
  return s;
}

int run_bench(const BenchArgs& a) {
  FP4MOE_CHECK(a.reps >= 1, "--reps must be >= 1");
  const int threads = a.threads > 0 ? a.threads : default_num_threads();
  MoeLayerWeights w;
  MoeConfig& c = w.cfg;
  c.hidden = a.hidden;
  c.inter = a.inter;
  c.num_experts = a.experts;
  c.top_k = a.top_k;
  c.scoring = ScoringFunc::Sigmoid;
  c.routed_scaling = 2.5f;
  c.shared_inter = a.shared_inter;
  std::mt19937 rng(uint32_t(a.seed));
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(a.hidden)));
  w.router_w.resize(size_t(a.experts * a.hidden));
  for (auto& v : w.router_w) v = nd(rng);
  w.router_bias.assign(size_t(a.experts), 0.0f);
  fmt::print(stderr, "building a random NVFP4 layer: H={} I={} E={} top-{} shared I={} ...\n", a.hidden,
             a.inter, a.experts, a.top_k, a.shared_inter);
  w.w13 = random_nvfp4(a.experts, 2 * a.inter, a.hidden, a.seed, threads);
  w.w2 = random_nvfp4(a.experts, a.hidden, a.inter, a.seed + 1, threads);
  if (a.shared_inter > 0) {
    w.shared_w13 = random_nvfp4(1, 2 * a.shared_inter, a.hidden, a.seed + 2, threads);
    w.shared_w2 = random_nvfp4(1, a.hidden, a.shared_inter, a.seed + 3, threads);
  }
  const double per_expert = double(w.w13.weight_bytes_per_expert() + w.w2.weight_bytes_per_expert());
  const double shared_bytes = a.shared_inter > 0 ? double(w.shared_w13->weight_bytes_per_expert() +
                                                          w.shared_w2->weight_bytes_per_expert())
                                                  : 0.0;
  const double router_bytes = double(w.router_w.size() * sizeof(float));

  // GB/s is wall-clock; "GB/cpu-s" divides by the CPU time the process got, which is what
  // to compare on a shared machine (it is GB/s per busy core).
  fmt::print("{:>6} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "tokens", "hit", "ms", "GB", "GB/s", "GB/cpu-s",
             "threads");
  std::normal_distribution<float> xd(0.0f, 1.0f);
  for (int64_t T : a.tokens) {
    FP4MOE_CHECK(T >= 1, "--tokens: {} is not a positive token count", T);
    std::vector<double> ms, gb, cpu;
    for (int rep = 0; rep <= a.reps; ++rep) {  // rep 0 warms up (pages, thread pool)
      std::vector<float> x(size_t(T * a.hidden));
      for (auto& v : x) v = xd(rng);
      CpuMoeOptions opt;
      opt.threads = threads;
      const double c0 = process_cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      const MoeOutput out = moe_forward_cpu(w, x.data(), T, opt);
      const auto t1 = std::chrono::steady_clock::now();
      const double c1 = process_cpu_seconds();
      std::vector<char> hit(size_t(a.experts), 0);
      for (int32_t id : out.routing.topk_ids) hit[size_t(id)] = 1;
      const int64_t nhit = std::count(hit.begin(), hit.end(), 1);
      if (rep == 0) continue;
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cpu.push_back(c1 - c0);
      gb.push_back((double(nhit) * per_expert + shared_bytes + router_bytes) / 1e9);
    }
    std::vector<size_t> order(ms.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return ms[i] < ms[j]; });
    const size_t med = order[order.size() / 2];
    const double hit_experts = (gb[med] * 1e9 - shared_bytes - router_bytes) / per_expert;
    fmt::print("{:>6} {:>6.0f} {:>10.2f} {:>10.3f} {:>10.2f} {:>10.2f} {:>8}\n", T, hit_experts, ms[med], gb[med],
               gb[med] / (ms[med] / 1e3), gb[med] / cpu[med], threads);
  }
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchArgs>();
  app.add_option("--tokens", a->tokens, "token counts to run (default 1 32)")->delimiter(',');
  app.add_option("--hidden", a->hidden, "hidden size H (default 6144, GLM-5)");
  app.add_option("--inter", a->inter, "expert intermediate size I (default 2048)");
  app.add_option("--experts", a->experts, "routed experts E (default 256)");
  app.add_option("--top-k", a->top_k, "experts per token (default 8)");
  app.add_option("--shared-inter", a->shared_inter, "shared expert intermediate, 0 = none (default 2048)");
  app.add_option("--reps", a->reps, "timed repetitions per token count; the median is shown (default 7)");
  app.add_option("--threads", a->threads, "worker threads (default: FP4MOE_THREADS or all cores)");
  app.add_option("--seed", a->seed, "random seed (default 1)");
  run = [a] { return run_bench(*a); };
}

const cli::Registrar reg{"bench cpu-moe",
                         "CPU MoE layer speed (weight GB/s) on a random NVFP4 layer at GLM-5 MoE dims", setup};

}  // namespace
}  // namespace fp4moe
