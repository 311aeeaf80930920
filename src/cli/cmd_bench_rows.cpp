// `fp4moe bench rows`: the decode step's small row kernels, each form side by side, at a few
// row counts (one decode step's B): median CUDA-event time per launch with L2 warm (the same
// launch repeated) and cold (L2 flushed before each run), beside the byte floor (the bytes the op
// must move at the copy bandwidth measured in the same run) and an empty kernel's launch.
//   rms_norm_f32   FP32 rows [rows, hidden] -> BF16 (the block norms, the final norm)
//   rms_norm_bf16  BF16 rows [rows, q_lora] -> BF16 (the q_a norm)
//   argmax         FP32 logits [rows, vocab] -> ids (the greedy step)
//   embed          BF16 table rows -> FP32 [rows, hidden]
//   gather         BF16 rows [rows, hidden] by index (before the lm_head)
//   rope           in place on 64 heads x 64 rope dims per token, interleaved (the MLA query)
// Forms: v0 the previous kernel, kept for this comparison (rms_norm_v0, argmax_rows_f32_v0,
// embed_rows_v0, gather_rows_v0; rope has its one form); now the engine's launch; for argmax also `now-1cta`
// (no workspace: one CTA per row). Table rows
// start with '|'.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "core/error.hpp"

#if defined(FP4MOE_HAVE_CUDA)
#include "cuda/bench/bench_util.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/embed/embed.hpp"
#include "cuda/norm/norm.hpp"
#include "cuda/rope/rope.hpp"
#include "cuda/sampling/argmax_f32.hpp"
#endif

namespace fp4moe::cli {
namespace {

struct Options {
  std::vector<int> rows = {1, 8, 64, 256};
  std::vector<std::string> ops = {"rms_norm_f32", "rms_norm_bf16", "argmax", "embed", "gather", "rope"};
  int hidden = 6144;
  int q_lora = 1536;
  int vocab = 154880;
  int iters = 50;
  std::string l2_flush = "read";
};

#if defined(FP4MOE_HAVE_CUDA)
constexpr int kRopeHeads = 64, kRopeDim = 64, kRopeHeadDim = 256;  // GLM-5's MLA query: nope 192 + rope 64

// Median of per-launch event times with L2 warm: 5 untimed launches, then `iters` timed ones.
double warm_us(const std::function<void()>& fn, int iters, cudaStream_t s) {
  for (int i = 0; i < 5; ++i) fn();
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (auto& e : ev) FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * i)], s));
    fn();
    FP4MOE_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * i + 1)], s));
  }
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    t.push_back(double(ms) * 1e3);
  }
  for (auto& e : ev) FP4MOE_CUDA_CHECK(cudaEventDestroy(e));
  return cuda::bench::median(t);
}

int run_bench(const Options& o) {
  FP4MOE_CHECK(o.hidden >= 1 && o.q_lora >= 1 && o.vocab >= 1 && o.iters >= 1,
               "bench rows: --hidden, --q-lora, --vocab and --iters must be >= 1");
  int max_rows = 0;
  for (int r : o.rows) {
    FP4MOE_CHECK(r >= 1, "bench rows: --rows values must be >= 1 (got {})", r);
    max_rows = std::max(max_rows, r);
  }
  for (const auto& op : o.ops)
    FP4MOE_CHECK(op == "rms_norm_f32" || op == "rms_norm_bf16" || op == "argmax" || op == "embed" || op == "gather" ||
                     op == "rope",
                 "bench rows: unknown op '{}' (rms_norm_f32, rms_norm_bf16, argmax, embed, gather, rope)", op);
  const auto flush = cuda::bench::l2_flush_from(o.l2_flush);
  cudaStream_t s;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto ceil = cuda::bench::measure_ceilings(s);
  const size_t R = size_t(max_rows), H = size_t(o.hidden), Q = size_t(o.q_lora), V = size_t(o.vocab);
  const size_t embed_vocab = 4096;  // table rows the tokens pick from (cold L2 makes every row a miss)
  cuda::DeviceBuffer x32(R * H * 4), x16(R * std::max(H, Q) * 2), y16(R * std::max(H, Q) * 2), w(std::max(H, Q) * 4),
      logits(R * V * 4), ids(R * 4), table(embed_vocab * H * 2), xf(R * H * 4),
      q(R * kRopeHeads * kRopeHeadDim * 2), freq(kRopeDim / 2 * 4),
      ws(cuda::sampling::argmax_rows_f32_workspace_bytes());
  FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr(), 0, ws.bytes()));  // zeroed once; every launch leaves it so
  cuda::bench::fill_random_f32(x32.as<float>(), R * H, 1, -3.0f, 3.0f, s);
  cuda::bench::fill_random_bf16(x16.ptr(), R * std::max(H, Q), 2, 1.0f, s);
  cuda::bench::fill_random_f32(w.as<float>(), std::max(H, Q), 3, 0.5f, 1.5f, s);
  cuda::bench::fill_random_f32(logits.as<float>(), R * V, 4, -8.0f, 8.0f, s);
  cuda::bench::fill_random_bf16(table.ptr(), embed_vocab * H, 5, 1.0f, s);
  cuda::bench::fill_random_bf16(q.ptr(), R * kRopeHeads * kRopeHeadDim, 6, 1.0f, s);
  cuda::bench::fill_random_f32(freq.as<float>(), kRopeDim / 2, 7, 1e-4f, 1.0f, s);
  std::vector<int32_t> id(R);
  for (size_t i = 0; i < R; ++i) id[i] = int32_t((i * 2654435761u) % embed_vocab);
  FP4MOE_CUDA_CHECK(cudaMemcpy(ids.ptr(), id.data(), R * 4, cudaMemcpyHostToDevice));
  // gather picks rows of x16 (R rows), not of the embedding table: its indices stay below R.
  for (size_t i = 0; i < R; ++i) id[i] = int32_t((i * 2654435761u) % R);
  cuda::DeviceBuffer gather_ids(R * 4);
  FP4MOE_CUDA_CHECK(cudaMemcpy(gather_ids.ptr(), id.data(), R * 4, cudaMemcpyHostToDevice));
  cuda::DeviceBuffer out_ids(R * 4);
  int32_t* out = out_ids.as<int32_t>();
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));

  cuda::bench::ColdL2Timer timer(s, flush);
  const double empty_warm = warm_us([&] { cuda::bench::launch_empty(s); }, o.iters, s);
  const double empty_cold = timer.time([&] { cuda::bench::launch_empty(s); }, o.iters).median_us;
  std::printf("copy bandwidth %.0f GB/s; L2 flush: %s; medians of %d launches; an empty kernel: %.2f us warm, "
              "%.2f us cold\n",
              ceil.copy_gbps, o.l2_flush.c_str(), o.iters, empty_warm, empty_cold);
  std::printf("| op | form | rows | warm us | cold us | floor us | cold x floor | cold GB/s |\n"
              "|---|---|---|---|---|---|---|---|\n");
  auto row = [&](const std::string& op, const char* form, int rows, double bytes, const std::function<void()>& fn) {
    const double wu = warm_us(fn, o.iters, s);
    const double cu = timer.time(fn, o.iters).median_us;
    const double floor_us = bytes / (ceil.copy_gbps * 1e3);
    std::printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.1f | %.0f |\n", op.c_str(), form, rows, wu, cu, floor_us,
                cu / floor_us, bytes / (cu * 1e3));
    std::fflush(stdout);
  };
  const int h = o.hidden, ql = o.q_lora, vocab = o.vocab;
  for (const auto& op : o.ops)
    for (int r : o.rows) {
      if (op == "rms_norm_f32") {
        const double bytes = double(r) * h * (4 + 2) + double(h) * 4;
        row(op, "v0", r, bytes, [&] { cuda::norm::rms_norm_v0(x32.as<float>(), h, r, h, w.as<float>(), 1e-6f, y16.as<uint16_t>(), h, s); });
        row(op, "now", r, bytes, [&] { cuda::norm::rms_norm(x32.as<float>(), h, r, h, w.as<float>(), 1e-6f, y16.as<uint16_t>(), h, s); });
      } else if (op == "rms_norm_bf16") {
        const double bytes = double(r) * ql * (2 + 2) + double(ql) * 4;
        row(op, "v0", r, bytes, [&] { cuda::norm::rms_norm_v0(x16.as<uint16_t>(), ql, r, ql, w.as<float>(), 1e-6f, y16.as<uint16_t>(), ql, s); });
        row(op, "now", r, bytes, [&] { cuda::norm::rms_norm(x16.as<uint16_t>(), ql, r, ql, w.as<float>(), 1e-6f, y16.as<uint16_t>(), ql, s); });
      } else if (op == "argmax") {
        const double bytes = double(r) * vocab * 4;
        row(op, "v0", r, bytes, [&] { cuda::sampling::argmax_rows_f32_v0(logits.as<float>(), r, vocab, out, s); });
        row(op, "now-1cta", r, bytes, [&] { cuda::sampling::argmax_rows_f32(logits.as<float>(), r, vocab, out, s); });
        row(op, "now", r, bytes, [&] {
          cuda::sampling::argmax_rows_f32(logits.as<float>(), r, vocab, out, ws.ptr(), ws.bytes(), s);
        });
      } else if (op == "embed") {
        const double bytes = double(r) * h * (2 + 4);
        row(op, "v0", r, bytes, [&] { cuda::embed::embed_rows_v0(table.ptr(), false, ids.as<int32_t>(), r, h, xf.as<float>(), s); });
        row(op, "now", r, bytes, [&] { cuda::embed::embed_rows(table.ptr(), false, ids.as<int32_t>(), r, h, xf.as<float>(), s); });
      } else if (op == "gather") {
        const double bytes = double(r) * h * (2 + 2);
        row(op, "v0", r, bytes, [&] { cuda::embed::gather_rows_v0(x16.as<uint16_t>(), h, gather_ids.as<int32_t>(), r, y16.as<uint16_t>(), s); });
        row(op, "now", r, bytes, [&] { cuda::embed::gather_rows(x16.as<uint16_t>(), h, gather_ids.as<int32_t>(), r, y16.as<uint16_t>(), s); });
      } else {  // rope
        const double bytes = double(r) * kRopeHeads * kRopeDim * 2 * 2;
        const int64_t ts = int64_t(kRopeHeads) * kRopeHeadDim;
        row(op, "now", r, bytes, [&] {
          cuda::rope::rope(q.as<uint16_t>(), r, kRopeHeads, ts, kRopeHeadDim, kRopeHeadDim - kRopeDim, kRopeDim,
                           ids.as<int32_t>(), freq.as<float>(), 1.0f, true, s);
        });
      }
    }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
#endif

void setup(CLI::App& app, std::function<int()>& run) {
  auto opt = std::make_shared<Options>();
  app.add_option("--rows", opt->rows, "row counts (a decode step's batch)")->delimiter(',')->capture_default_str();
  app.add_option("--op", opt->ops, "ops: rms_norm_f32, rms_norm_bf16, argmax, embed, gather, rope")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--hidden", opt->hidden, "hidden size (rms_norm_f32, embed, gather)")->capture_default_str();
  app.add_option("--q-lora", opt->q_lora, "q_lora rank (rms_norm_bf16)")->capture_default_str();
  app.add_option("--vocab", opt->vocab, "vocabulary size (argmax)")->capture_default_str();
  app.add_option("--iters", opt->iters, "timed launches per case (median), warm and cold each")->capture_default_str();
  add_l2_flush_option(app, opt->l2_flush);
  run = [opt] {
#if defined(FP4MOE_HAVE_CUDA)
    return run_bench(*opt);
#else
    FP4MOE_FAIL("bench rows: this fp4moe was built without CUDA");
    return 1;
#endif
  };
}

Registrar reg{"bench rows",
              "Benchmark the decode step's row kernels (norms, argmax, embed, gather, rope): previous vs present form, "
              "warm and cold L2, beside the byte floor",
              setup};

}  // namespace
}  // namespace fp4moe::cli
