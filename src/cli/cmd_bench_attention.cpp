// `fp4moe bench attention`: MLA attention and the DSA indexer at GLM-5 dimensions (64 heads,
// latent 512 + rope 64, indexer 32 x 128, top-2048, page size 64), on one layer's paged cache
// with every request's pages scattered over the pool.
//   decode  batch x context: dense MLA (FlashInfer's SM90 kernel via MlaSm90, and our
//           MlaDecodeMma: mma.sync and wgmma), and for context > top-k the sparse path: indexer
//           scores -> top-k -> sparse MLA over the selected slots (every kernel); each stage timed
//           alone and the three back to back (with the fastest top-k and sparse MLA measured);
//           every kernel also through run_device (the schedule built on the device: the runner's
//           graph-captured path, "-dev");
//   prefill one fresh request of N tokens (causal), in query chunks of <= 16K tokens, in the
//           absorbed form (MlaSm90) and the expanded form (kv_b_proj GEMMs + FA3 prefill);
//   fp8     how often the FP8 indexer changes the selected set against the FP32 one (random
//           and model-like keys / queries).
// Every time is cold-L2 (256 MiB memset or read before each run: --l2-flush, median). Floors:
// bytes / the copy bandwidth measured in the same run (decode), flops / the BF16 (or FP8)
// cuBLASLt peak (prefill). Beside them, floor kernels under the same timer: "floor-move" (one
// launch moving a dense decode's bytes, contiguous), "floor-gather" (the latents through the
// page table / the selected slots: the cache's scattered order) and "floor-chain<n>" (the sparse
// pipeline's stage bytes in three launches, then padded with empty ones to the pipeline graph's
// launch count).
// Table rows start with '|'; --json writes everything.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_attention.hpp"
#include "cli/command.hpp"
#include "core/error.hpp"

namespace fp4moe::cli {
namespace {

using namespace attn_bench;

#if defined(FP4MOE_HAVE_CUDA)
int run_bench(const Options& opt) {
  FP4MOE_CHECK(opt.iters >= 1, "--iters must be >= 1");
  bench::l2_flush_from(opt.l2_flush);  // a bad value: one line, before any GPU work
  FP4MOE_CHECK(at::log2_exact(opt.page_size) >= 0, "--page-size {} must be a power of two", opt.page_size);
  FP4MOE_CHECK(opt.top_k >= 1 && opt.top_k <= ix::kMaxTopK, "--top-k {} outside [1, {}]", opt.top_k, ix::kMaxTopK);
  for (int b : opt.batches) FP4MOE_CHECK(b >= 1 && b <= 4096, "--batch {} outside [1, 4096]", b);
  for (int c : opt.contexts) FP4MOE_CHECK(c >= 1 && c <= (1 << 20), "--ctx {} outside [1, 2^20]", c);
  for (int n : opt.prefill) FP4MOE_CHECK(n >= 1 && n <= (1 << 17), "--prefill {} outside [1, 131072]", n);
  std::vector<KvElem> elems;
  for (const auto& k : opt.kv) {
    FP4MOE_CHECK(k == "bf16" || k == "fp8", "--kv {}: bf16 or fp8", k);
    elems.push_back(k == "bf16" ? KvElem::BF16 : KvElem::FP8_E4M3);
  }
  FP4MOE_CHECK(cuda::device_available(), "bench attention needs a CUDA GPU");
  const int sm = cuda::current_device().cc;
  const std::string why = at::mla_can_implement({kHeads, kSmScale, KvElem::BF16}, sm);
  FP4MOE_CHECK(why.empty(), "bench attention: {}", why);
  cudaStream_t s;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Bench b(opt, s);
  const auto& c = b.ceilings();
  std::printf("device: %s (sm_%d)  copy %.0f GB/s  bf16 %.0f TFLOP/s  fp8 %.0f TFLOP/s (cuBLASLt 8192^3)\n",
              cuda::current_device().name.c_str(), sm, c.copy_gbps, c.bf16_tflops, c.fp8_tflops);
  std::printf("GLM-5 MLA: 64 heads, latent 512 + rope 64; indexer 32 x 128, top-%d; page size %d; L2 flushed by %s\n",
              opt.top_k, opt.page_size, opt.l2_flush == "read" ? "a read (clean lines)" : "a memset (dirty lines)");
  std::printf("| kind          | kv       | path                     |    B |    ctx |         us |    GB/s | TFLOP/s | %% copy | %% bf16 | x floor | note\n");
  for (KvElem e : elems) b.guard("decode", [&] { b.decode(e); });
  if (opt.do_prefill)
    for (KvElem e : elems) b.guard("prefill", [&] { b.prefill(e); });
  if (opt.key_writes) b.guard("key writes", [&] { b.key_writes(); });
  nlohmann::json agreement = nlohmann::json::array();
  if (opt.fp8_agreement) {
    b.guard("fp8 agreement (random)", [&] { b.fp8_agreement(false, agreement); });
    b.guard("fp8 agreement (model-like)", [&] { b.fp8_agreement(true, agreement); });
  }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  if (!opt.json_path.empty()) {
    nlohmann::json j;
    j["device"] = cuda::current_device().name;
    j["commit"] = std::getenv("FP4MOE_COMMIT") ? std::getenv("FP4MOE_COMMIT") : "unknown";
    j["ceilings"] = {{"copy_gbps", c.copy_gbps}, {"bf16_tflops", c.bf16_tflops}, {"fp8_tflops", c.fp8_tflops}};
    j["page_size"] = opt.page_size;
    j["top_k"] = opt.top_k;
    j["l2_flush"] = opt.l2_flush;
    nlohmann::json rs = nlohmann::json::array();
    for (const Row& r : b.rows)
      rs.push_back({{"kind", r.kind}, {"kv", r.kv}, {"path", r.path}, {"batch", r.batch}, {"ctx", r.ctx},
                    {"us", r.us}, {"bytes", r.bytes}, {"flops", r.flops}, {"floor_us", r.floor_us},
                    {"x_floor", r.us / r.floor_us}, {"note", r.note}});
    j["results"] = rs;
    j["fp8_selection"] = agreement;
    std::ofstream f(opt.json_path);
    FP4MOE_CHECK(f.good(), "cannot write {}", opt.json_path);
    f << j.dump(2) << "\n";
  }
  FP4MOE_CHECK(b.failures() == 0, "bench attention: {} case(s) failed (see the table)", b.failures());
  return 0;
}
#endif

void setup(CLI::App& app, std::function<int()>& run) {
  auto opt = std::make_shared<Options>();
  app.add_option("--batch", opt->batches, "decode batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--ctx", opt->contexts, "decode context lengths")->delimiter(',')->capture_default_str();
  app.add_option("--prefill", opt->prefill, "prefill lengths (one fresh request each)")->delimiter(',')
      ->capture_default_str();
  app.add_option("--kv", opt->kv, "KV cache element types: bf16, fp8")->delimiter(',')->capture_default_str();
  app.add_option("--page-size", opt->page_size, "tokens per page (power of two)")->capture_default_str();
  app.add_option("--top-k", opt->top_k, "indexer top-k")->capture_default_str();
  app.add_option("--iters", opt->iters, "timed runs per case (median, cold L2)")->capture_default_str();
  app.add_option("--json", opt->json_path, "write the results as JSON");
  add_l2_flush_option(app, opt->l2_flush);
  app.add_flag("!--no-sparse", opt->sparse, "skip the sparse (indexer + top-k + sparse MLA) decode path");
  app.add_flag("!--no-prefill", opt->do_prefill, "skip prefill");
  app.add_flag("!--no-fp8-agreement", opt->fp8_agreement, "skip the FP8-vs-FP32 selection comparison");
  app.add_flag("!--no-key-writes", opt->key_writes, "skip the cache-write comparison (the runner's unfused norms + RoPE + append vs the fused kernels)");
  run = [opt] {
#if defined(FP4MOE_HAVE_CUDA)
    return run_bench(*opt);
#else
    FP4MOE_FAIL("bench attention: this fp4moe was built without CUDA");
    return 1;
#endif
  };
}

Registrar reg{"bench attention", "Benchmark MLA attention and the DSA indexer (GLM-5 dims) against their floors",
              setup};

}  // namespace
}  // namespace fp4moe::cli
