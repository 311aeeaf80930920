// `fp4moe bench sampling`: the device sampler (cuda/sampling/) over F32 logits [rows, vocab]
// (GLM-5's vocab 154,880 by default) for several parameter mixes, cold L2, median; the floor
// is reading the logits once at the copy bandwidth measured in the same run.
//   greedy  temperature 0
//   temp    temperature 1, no truncation (max pass + draw pass)
//   topkp   temperature 0.7, top-k 50, top-p 0.9 (the common chat setting)
//   full    top-k 200, top-p 0.8, min-p 0.01, all three penalties over 256 history tokens,
//           logprobs with the top 20
// Table rows start with '|'.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "core/error.hpp"

#if defined(FP4MOE_HAVE_CUDA)
#include "cuda/bench/bench_util.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/sampling/sampling.hpp"
#endif

namespace fp4moe::cli {
namespace {

struct Options {
  std::vector<int> rows = {1, 8, 64, 256, 1024};
  std::vector<std::string> modes = {"greedy", "temp", "topkp", "full"};
  int vocab = 154880;
  std::string l2_flush = "write";
  int iters = 20;
};

#if defined(FP4MOE_HAVE_CUDA)
namespace sp = cuda::sampling;

cpu::SamplingParams mode_params(const std::string& mode, int r) {
  cpu::SamplingParams p;
  p.seed = uint64_t(r) * 7919;
  p.temperature = 0.0f;
  if (mode == "greedy") return p;
  p.temperature = 1.0f;
  if (mode == "temp") return p;
  if (mode == "topkp") {
    p.temperature = 0.7f, p.top_k = 50, p.top_p = 0.9f;
    return p;
  }
  FP4MOE_CHECK(mode == "full", "bench sampling: unknown mode '{}' (greedy, temp, topkp, full)", mode);
  p.top_k = 200, p.top_p = 0.8f, p.min_p = 0.01f;
  p.repetition_penalty = 1.1f, p.presence_penalty = 0.2f, p.frequency_penalty = 0.1f;
  p.logprobs_top_n = cpu::kMaxTopLogprobs;
  return p;
}

int run_bench(const Options& o) {
  const auto flush = cuda::bench::l2_flush_from(o.l2_flush);
  cudaStream_t stream;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto ceil = cuda::bench::measure_ceilings(stream);
  std::printf("copy bandwidth %.0f GB/s; vocab %d; cold L2, median of up to %d runs\n", ceil.copy_gbps, o.vocab, o.iters);
  std::printf("| mode | rows | us | us/row | floor us | x floor | GB/s |\n|---|---|---|---|---|---|---|\n");
  int max_rows = 0;
  for (int r : o.rows) max_rows = std::max(max_rows, r);
  FP4MOE_CHECK(max_rows >= 1 && o.vocab >= 1, "bench sampling: rows and vocab must be >= 1");
  const int64_t H = 256;  // history per row: 128 prompt + 128 output tokens
  cuda::DeviceBuffer logits(size_t(max_rows) * size_t(o.vocab) * 4), tokens(size_t(max_rows) * 4),
      lp(size_t(max_rows) * 4), top_ids(size_t(max_rows) * cpu::kMaxTopLogprobs * 4),
      top_lp(size_t(max_rows) * cpu::kMaxTopLogprobs * 4), ws(sp::sample_workspace_bytes(max_rows, o.vocab));
  cuda::bench::fill_random_f32(logits.as<float>(), size_t(max_rows) * size_t(o.vocab), 1, -8.0f, 8.0f, stream);
  std::mt19937 g(3);
  std::vector<int32_t> hist(static_cast<size_t>(max_rows) * H), plen(size_t(max_rows), 128), olen(size_t(max_rows), 128),
      draw(static_cast<size_t>(max_rows));
  for (auto& t : hist) t = int32_t(g() % uint32_t(o.vocab));
  for (auto& d : draw) d = int32_t(g() % 1000);
  auto dh = cuda::DeviceBuffer::from(hist), dp = cuda::DeviceBuffer::from(plen), dol = cuda::DeviceBuffer::from(olen),
       dd = cuda::DeviceBuffer::from(draw);
  cuda::bench::ColdL2Timer timer(stream, flush);
  for (const auto& mode : o.modes) {
    std::vector<cpu::SamplingParams> params;
    for (int r = 0; r < max_rows; ++r) params.push_back(mode_params(mode, r));
    auto dparams = cuda::DeviceBuffer::from(params);
    for (int rows : o.rows) {
      sp::SampleArgs a;
      a.logits = logits.as<float>(), a.logits_stride = o.vocab, a.rows = rows, a.vocab = o.vocab;
      a.params = dparams.as<cpu::SamplingParams>(), a.draw_index = dd.as<int32_t>();
      a.history = dh.as<int32_t>(), a.history_stride = H, a.prompt_len = dp.as<int32_t>(), a.output_len = dol.as<int32_t>();
      a.tokens = tokens.as<int32_t>(), a.logprob = lp.as<float>();
      a.top_ids = top_ids.as<int32_t>(), a.top_logprobs = top_lp.as<float>();
      const auto t = timer.time([&] { sp::sample(a, ws.ptr(), ws.bytes(), stream); }, o.iters);
      const double bytes = double(rows) * double(o.vocab) * 4.0;
      const double floor_us = bytes / (ceil.copy_gbps * 1e3);
      std::printf("| %s | %d | %.1f | %.2f | %.1f | %.1f | %.0f |\n", mode.c_str(), rows, t.median_us,
                  t.median_us / rows, floor_us, t.median_us / floor_us, bytes / (t.median_us * 1e3));
      std::fflush(stdout);
    }
  }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
#endif

void setup(CLI::App& app, std::function<int()>& run) {
  auto opt = std::make_shared<Options>();
  app.add_option("--rows", opt->rows, "batch rows (requests)")->delimiter(',')->capture_default_str();
  app.add_option("--mode", opt->modes, "parameter mixes: greedy, temp, topkp, full")->delimiter(',')->capture_default_str();
  app.add_option("--vocab", opt->vocab, "vocabulary size")->capture_default_str();
  app.add_option("--iters", opt->iters, "timed runs per case (median, cold L2)")->capture_default_str();
  add_l2_flush_option(app, opt->l2_flush);
  run = [opt] {
#if defined(FP4MOE_HAVE_CUDA)
    return run_bench(*opt);
#else
    FP4MOE_FAIL("bench sampling: this fp4moe was built without CUDA");
    return 1;
#endif
  };
}

Registrar reg{"bench sampling", "Benchmark the device sampler (logits F32 [rows, vocab]) against reading the logits once",
              setup};

}  // namespace
}  // namespace fp4moe::cli
