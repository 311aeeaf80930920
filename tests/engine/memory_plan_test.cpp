#include <gtest/gtest.h>

#include "core/error.hpp"
#include "backend/runner_memory_plan.hpp"
#include "engine/memory_plan.hpp"

#include <cstdio>

#include <fmt/format.h>

using namespace fp4moe;
using namespace fp4moe::engine;

namespace {

BackendInfo gpu_like() {
  BackendInfo i;
  i.name = "gpu-like";
  i.kv_bytes_per_token = 1000;
  i.weight_bytes = 500'000;
  i.workspace_bytes = 100'000;
  i.device_bytes = 1'000'000;
  i.default_mem_fraction = 0.88;
  return i;
}

}  // namespace

TEST(MemoryPlan, KvPoolFromWhatTheDeviceFractionLeaves) {
  MemoryPlanRequest r;
  r.page_size = 16;
  const MemoryPlan p = plan_memory(gpu_like(), r);  // 0.88 x 1e6 - 6e5 = 280000 B = 280 tokens = 17 pages
  EXPECT_EQ(p.num_pages, 17);
  EXPECT_EQ(p.tokens(), 272);
  EXPECT_EQ(p.kv_bytes, 272'000);
  r.mem_fraction_static = 0.7;  // 100000 B: 100 tokens, 6 pages
  EXPECT_EQ(plan_memory(gpu_like(), r).num_pages, 6);
  r.max_total_tokens = 32;  // caps the fraction
  EXPECT_EQ(plan_memory(gpu_like(), r).num_pages, 2);
  EXPECT_NE(plan_memory(gpu_like(), r).describe().find("KV pool 2 pages x 16 tokens"), std::string::npos);
}

TEST(MemoryPlan, HostBackendsTakeATokenCountNotTheMachine) {
  BackendInfo host = gpu_like();
  host.default_mem_fraction = 0.0;
  MemoryPlanRequest r;
  r.page_size = 4;
  r.default_tokens = 4096;
  EXPECT_EQ(plan_memory(host, r).num_pages, 1024);
  r.max_total_tokens = 10;
  EXPECT_EQ(plan_memory(host, r).num_pages, 2);
}

TEST(MemoryPlan, ImpossiblePlansAreOneLineErrors) {
  MemoryPlanRequest r;
  r.mem_fraction_static = 0.5;  // 500000 < weights + workspace
  EXPECT_THROW(plan_memory(gpu_like(), r), Error);
  BackendInfo unknown = gpu_like();
  unknown.device_bytes = 0;
  EXPECT_THROW(plan_memory(unknown, r), Error);
  MemoryPlanRequest tiny;
  tiny.page_size = 16;
  tiny.max_total_tokens = 8;  // less than a page
  EXPECT_THROW(plan_memory(gpu_like(), tiny), Error);
}

TEST(MemoryPlan, ABackendThatPlannedItsPoolIsTakenAsIs) {
  BackendInfo planned = gpu_like();
  planned.kv_pool_tokens = 4096;  // the GPU runner sized its pool at load from the same flags
  MemoryPlanRequest r;
  r.page_size = 16;
  r.mem_fraction_static = 0.7;
  const MemoryPlan p = plan_memory(planned, r);
  EXPECT_EQ(p.num_pages, 256);
  EXPECT_DOUBLE_EQ(p.mem_fraction_static, 0.7);
  EXPECT_NE(p.describe().find("device"), std::string::npos);
}

TEST(MemoryPlan, AHostPlanDoesNotPrintADeviceFraction) {
  BackendInfo host = gpu_like();
  host.default_mem_fraction = 0.0;
  MemoryPlanRequest r;
  r.page_size = 4;
  r.max_total_tokens = 64;
  EXPECT_EQ(plan_memory(host, r).describe().find("device"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The GPU runner's plan (plan_runner_memory) for GLM-5's real dimensions (DESIGN.md / make-synthetic's
// glm5-layer preset: H 6144, 64 heads, q_lora 2048, kv_lora 512 + rope 64, v 256, DSA indexer 32 x 128,
// top-2048, vocab 154880, 256 experts top-8 of inter 2048, a BF16 shared expert and dense layers of
// 12288 run as dense MLPs; 78 layers, every one with an index key: (512 + 64 + 128) x 2 B = 1408 B
// per token and layer). Per GPU over `gpus` GPUs: the weights (~440 GB in NVFP4) and the attention
// heads divided; the rest (indexer, MoE rows, vocab) as on one GPU: an upper bound.
namespace {

RunnerDims glm5_dims(int64_t gpus, int64_t layers) {
  RunnerDims d;
  d.hidden = 6144, d.heads = 64 / gpus, d.qk_head_dim = 192 + 64, d.kv_lora = 512, d.rope = 64, d.v_head = 256;
  d.q_lora = 2048, d.index_heads = 32, d.index_dim = 128, d.index_topk = 2048, d.indexer = true;
  d.vocab = 154880, d.max_inter = 12288;
  d.moe = true, d.experts = 256, d.top_k = 8, d.moe_inter = 2048, d.moe_rows_per_token = 8;
  d.kv_bytes_per_token = layers * (512 + 64 + 128) * 2;
  return d;
}

// Decode graph buckets up to n (gpu_runner.cpp's graph_buckets).
int64_t buckets(int64_t n) {
  int64_t c = 0;
  for (int64_t x : {1, 2, 4}) c += x <= n;
  for (int64_t x = 8; x <= std::min<int64_t>(n, 64); x += 8) ++c;
  for (int64_t x = 96; x <= std::min<int64_t>(n, 256); x += 32) ++c;
  for (int64_t x = 320; x <= std::min<int64_t>(n, 1024); x += 64) ++c;
  return c;
}

// serve's sizing (make_backend): tokens per step = --chunked-prefill-size 2048 + the running
// requests (fixed), one logits row per request, graphs up to the running requests.
RunnerPlanInput serve_input(int64_t device, int64_t ctx, int64_t reqs) {
  RunnerPlanInput in;
  in.dims = glm5_dims(8, 78);
  in.device_bytes = device;
  in.in_use_bytes = 600'000'000;  // the CUDA context and libraries
  in.weight_bytes = 440'000'000'000 / 8;
  in.max_tokens = 2048 + reqs;
  in.max_logits_rows = reqs;
  in.max_requests = reqs;
  in.max_context = ctx;
  in.graph_buckets = buckets(reqs);
  return in;
}

constexpr int64_t kH100 = 80'000'000'000, kH200 = 141'000'000'000;

}  // namespace

TEST(RunnerMemoryPlan, Glm5OnEightGpusServeTable) {
  const int64_t ctxs[] = {4096, 32768, 131072, 200000}, reqs[] = {1, 64, 1024};
  for (int64_t device : {kH100, kH200})
    for (int64_t ctx : ctxs)
      for (int64_t r : reqs) {
        const RunnerPlanInput in = serve_input(device, ctx, r);
        const RunnerPlan p = plan_runner_memory(in);
        const RunnerWorkspace w = p.ok ? p.ws : runner_workspace(in, in.max_tokens, r);
        std::printf("%s ctx %6lld reqs %4lld | T %5lld | indexer %6.2f act %5.2f moe %5.2f logits %5.2f sampling %5.2f"
                    " = ws %6.2f GB | graphs %.2f | min KV %6.2f GB | %s\n",
                    device == kH100 ? "H100" : "H200", (long long)ctx, (long long)r, (long long)in.max_tokens,
                    w.indexer / 1e9, w.activations / 1e9, w.moe / 1e9, w.logits / 1e9, w.sampling / 1e9,
                    w.total() / 1e9, double(r == 0 ? 0 : buckets(r) * kGraphBytesPerBucket) / 1e9,
                    double(((ctx + 63) / 64 + 1) * 64 * in.dims.kv_bytes_per_token) / 1e9,
                    p.ok ? fmt::format("ok, KV pool {} tokens", p.kv_tokens).c_str() : p.error.c_str());
        // The serve sizing never lowers the tokens per step; every plan keeps the workspace in its
        // budget (10 % of the device), and it is refused exactly when the pieces do not fit.
        EXPECT_FALSE(p.tokens_lowered);
        const int64_t avail = int64_t(double(device) * 0.88) - in.in_use_bytes;
        const int64_t need = in.weight_bytes + w.total() + in.graph_buckets * kGraphBytesPerBucket +
                             ((ctx + 63) / 64 + 1) * 64 * in.dims.kv_bytes_per_token;
        EXPECT_EQ(p.ok, need <= avail && w.total() <= device / 10) << ctx << " x " << r;
        if (p.ok) {
          EXPECT_LE(p.ws.total(), device / 10);
          EXPECT_EQ(p.kv_tokens, (avail - need + p.min_kv_bytes) / in.dims.kv_bytes_per_token);
          EXPECT_GE(p.kv_tokens, ctx);
        } else {
          EXPECT_EQ(p.error.find('\n'), std::string::npos);
          EXPECT_NE(p.error.find("memory plan: "), std::string::npos);
          EXPECT_NE(p.error.find("--context-length"), std::string::npos) << p.error;
        }
        if (ctx == 131072) {
          EXPECT_LE(w.total(), kH100 / 10) << "workspace at 128K, " << r << " requests";
        }
      }
  // The H100's 80 GB leave 14.8 GB beside 55 GB of weights: 4K and 32K serve every count, 128K and
  // 200K (14.4 / 22.0 GB of KV for one request alone) none; the H200 serves all of them.
  for (int64_t r : reqs) {
    EXPECT_TRUE(plan_runner_memory(serve_input(kH100, 4096, r)).ok) << r;
    EXPECT_TRUE(plan_runner_memory(serve_input(kH100, 32768, r)).ok) << r;
    const RunnerPlan p128 = plan_runner_memory(serve_input(kH100, 131072, r));
    EXPECT_FALSE(p128.ok);
    EXPECT_NE(p128.error.find("the smallest KV pool 14.40 GB (one request of 131072 tokens; 131136 tokens with the padding page at "
                            "109824 B/token)"),
              std::string::npos)
        << p128.error;
    EXPECT_FALSE(plan_runner_memory(serve_input(kH100, 200000, r)).ok);
    EXPECT_TRUE(plan_runner_memory(serve_input(kH200, 200000, r)).ok) << r;
  }
}

// --kv-cache-dtype fp8_e4m3: the latent, rope key and index key at 1 B per element, so GLM-5's
// 78 layers take 78 x 704 B per token instead of 78 x 1408 B, and the same plan's pool holds
// twice the tokens less what the quantized indexer queries add to the workspace ([T, 32, 128]
// E4M3 + [T, 32] FP32 per step: 4.3 KB per token per step, ~9 MB at 2048 + 64 tokens): the
// issue's target is >= 1.9x. 128K context on one H100 (refused in BF16 above: 14.4 GB for one
// request) fits in FP8 (7.2 GB).
TEST(RunnerMemoryPlan, Fp8KvCacheHoldsTwiceTheTokens) {
  EXPECT_EQ(runner_kv_bytes_per_token(78, 78, 512, 64, 128, KvElem::BF16, KvElem::BF16), 78 * 704 * 2);
  EXPECT_EQ(runner_kv_bytes_per_token(78, 78, 512, 64, 128, KvElem::FP8_E4M3, KvElem::FP8_E4M3), 78 * 704);
  EXPECT_EQ(runner_kv_bytes_per_token(5, 3, 64, 32, 48, KvElem::FP8_E4M3, KvElem::BF16), 5 * 96 + 3 * 48 * 2);
  for (int64_t device : {kH100, kH200})
    for (int64_t ctx : {32768, 131072})
      for (int64_t r : {1, 8, 64}) {
        RunnerPlanInput bf = serve_input(device, ctx, r);
        RunnerPlanInput f8 = bf;
        f8.dims.kv_bytes_per_token = runner_kv_bytes_per_token(78, 78, 512, 64, 128, KvElem::FP8_E4M3, KvElem::FP8_E4M3);
        f8.dims.fp8_index_queries = true;
        const RunnerPlan pb = plan_runner_memory(bf), p8 = plan_runner_memory(f8);
        ASSERT_TRUE(p8.ok) << p8.error;
        EXPECT_EQ(p8.ws.indexer - pb.ws.indexer,
                  (int64_t(f8.max_tokens) * 32 * 128 + 255) / 256 * 256 + (int64_t(f8.max_tokens) * 32 * 4 + 255) / 256 * 256);
        if (!pb.ok) {  // BF16 cannot hold one request at this context here; FP8 can
          EXPECT_TRUE(device == kH100 && ctx == 131072) << pb.error;
          EXPECT_GE(p8.kv_tokens, ctx);
          std::printf("%s ctx %6lld reqs %2lld | KV pool BF16: refused | FP8 %lld tokens\n",
                      device == kH100 ? "H100" : "H200", (long long)ctx, (long long)r, (long long)p8.kv_tokens);
          continue;
        }
        const double ratio = double(p8.kv_tokens) / double(pb.kv_tokens);
        std::printf("%s ctx %6lld reqs %2lld | KV pool BF16 %lld tokens, FP8 %lld tokens: %.3fx\n",
                    device == kH100 ? "H100" : "H200", (long long)ctx, (long long)r, (long long)pb.kv_tokens,
                    (long long)p8.kv_tokens, ratio);
        EXPECT_GE(ratio, 1.9) << ctx << " x " << r;
        EXPECT_LE(ratio, 2.0 + 1e-9);  // (never more than the byte ratio: the rest of the plan is the same or larger)
      }
}

TEST(RunnerMemoryPlan, TheIndexerScoresRunInChunksOfRows) {
  // 200K context, 64 requests on an H200 share, --chunked-prefill-size 16384: the score rows of
  // the whole step would be 16448 x 200000 x 4 B = 13.2 GB (over the 14.1 GB budget with the
  // rest); in chunks of a quarter of the budget / (200000 x 4 B) = 4406 rows they take 3.5 GB.
  RunnerPlanInput in = serve_input(kH200, 200000, 64);
  in.max_tokens = 16384 + 64;
  const int64_t rows = int64_t(double(kH200) * 0.10 * 0.25) / (200000 * 4);
  EXPECT_EQ(rows, 4406);
  EXPECT_EQ(runner_score_rows(in, in.max_tokens), rows);
  const RunnerPlan p = plan_runner_memory(in);
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.score_rows, rows);
  EXPECT_LE(p.ws.total(), kH200 / 10);
  auto a = [](int64_t b) { return (b + 255) / 256 * 256; };
  EXPECT_EQ(p.ws.indexer, a(rows * 200000 * 4) + a(66 * 4) + 2 * a(16448LL * 2048 * 4) + a(rows * 64) +
                              a(rows * 4096 * 8) + a(rows * 6250 * 4));
  EXPECT_GT(16448LL * 200000 * 4 + p.ws.total() - p.ws.indexer, kH200 / 10);  // unchunked: over the budget
  // Decode steps never chunk: at least a row per request (1024 requests at 200K, the 80 GB share:
  // 2 GB / 800 KB = 2500 rows a chunk; with a 1 % share 1024, the requests' floor).
  RunnerPlanInput many = serve_input(kH100, 200000, 1024);
  many.min_score_rows = 1024;
  EXPECT_EQ(runner_score_rows(many, 3072), 2500);
  many.indexer_share = 0.01;
  EXPECT_EQ(runner_score_rows(many, 3072), 1024);
  // A short context: one chunk, the whole step.
  EXPECT_EQ(runner_score_rows(serve_input(kH100, 4096, 64), 2112), 2112);
  // What no chunking helps: --chunked-prefill-size 32768 at 32K on the 80 GB share (the activations
  // and MoE scratch of 32832 tokens alone pass the 8 GB budget): refused, naming the flag and what fits.
  RunnerPlanInput big = serve_input(kH100, 32768, 64);
  big.max_tokens = 32768 + 64;
  const RunnerPlan q = plan_runner_memory(big);
  ASSERT_FALSE(q.ok);
  EXPECT_NE(q.error.find("over its budget of 8.00 GB (10 % of the device's 80.00 GB); lower --chunked-prefill-size "
                         "(at most "),
            std::string::npos)
      << q.error;
}

TEST(RunnerMemoryPlan, BenchStepLowersTheTokensPerStepToFit) {
  // bench step on 13 glm5-layer layers (3 dense + 10 MoE, 64.88 GB of weights) on an H100 (85.5 GB
  // as cudaMemGetInfo reports it): --prefill up to 16384 asked, the decode batch the floor.
  RunnerPlanInput in;
  in.dims = glm5_dims(1, 13);
  in.device_bytes = 85'500'000'000;
  in.in_use_bytes = 600'000'000;
  in.weight_bytes = 64'880'000'000;
  in.max_tokens = 16384;
  in.min_tokens = 8;
  in.max_logits_rows = 8;
  in.max_requests = 8;
  in.max_decode_steps = 8;
  in.graph_buckets = buckets(8);
  in.tokens_flag = "--prefill";
  for (int64_t ctx : {1024 + 8, 32768 + 8, 131072 + 8}) {
    in.max_context = ctx;
    const RunnerPlan p = plan_runner_memory(in);
    std::printf("13 layers, ctx %lld: %s\n", (long long)ctx, p.ok ? p.describe().c_str() : p.error.c_str());
    ASSERT_TRUE(p.ok) << p.error;
    EXPECT_LE(p.ws.total(), in.device_bytes / 10);
    EXPECT_GE(p.kv_tokens, ctx);
    EXPECT_GE(p.max_tokens, 1024);  // the shortest prefill still runs
    // The largest: one more token would not fit.
    if (p.tokens_lowered) {
      const int64_t room = std::min(p.workspace_budget, int64_t(85'500'000'000 * 0.88) - in.in_use_bytes -
                                                            in.weight_bytes - p.graph_bytes - p.min_kv_bytes);
      EXPECT_GT(runner_workspace(in, p.max_tokens + 1, 8).total(), room);
    }
  }
  // Where it fits, what was asked is kept: 4096 tokens/step at 1K (the first row).
  in.max_context = 1024 + 8;
  in.max_tokens = 4096;
  EXPECT_FALSE(plan_runner_memory(in).tokens_lowered);
  EXPECT_EQ(plan_runner_memory(in).max_tokens, 4096);
  in.max_context = 131072 + 8;
  EXPECT_FALSE(plan_runner_memory(in).tokens_lowered);  // 4096 fit at 128K too
  in.max_tokens = 16384;
  EXPECT_TRUE(plan_runner_memory(in).tokens_lowered);
  // A floor that cannot fit: 8192 running requests at 128K.
  in.min_tokens = in.max_requests = in.max_logits_rows = 8192;
  const RunnerPlan p = plan_runner_memory(in);
  EXPECT_FALSE(p.ok);
  EXPECT_NE(p.error.find("lower --max-running-requests"), std::string::npos) << p.error;
}

TEST(RunnerMemoryPlan, WeightsThatDoNotFitAreSaidFirst) {
  RunnerPlanInput in = serve_input(kH100, 4096, 1);
  in.weight_bytes = 440'000'000'000 / 4;  // 110 GB on one 80 GB GPU
  const RunnerPlan p = plan_runner_memory(in);
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.error.rfind("memory plan: the weights (110.00 GB) do not fit 0.88 x the device's 80.00 GB", 0), 0u)
      << p.error;
}

// The workspace is one list (runner_workspace_buffers): the plan's parts are its sums, every
// Scratch buffer is in it once, the FP8 index queries only with an FP8 cache's fast scores, the
// rope queries a 1-byte stub without the fast attention; a dense-experts model gets the fallback's
// [E, T, ...] buffers, an FP4 one empty ones.
TEST(RunnerMemoryPlan, TheWorkspaceIsOneListThePlanSumsAndTheRunnerLaysOut) {
  for (bool fp8 : {false, true})
    for (bool rope_queries : {false, true})
      for (bool dense_experts : {false, true}) {
        RunnerPlanInput in = serve_input(kH100, 32768, 8);
        in.dims.fp8_index_queries = fp8;
        in.dims.rope_queries = rope_queries;
        in.dims.dense_experts = dense_experts;
        const int64_t T = 512, L = 8;
        const std::vector<WsBuffer> list = runner_workspace_buffers(in, T, L);
        std::vector<int> seen(size_t(WsBuf::Count), 0);
        int64_t sum = 0;
        for (const WsBuffer& b : list) {
          ++seen[size_t(b.id)];
          EXPECT_GE(b.bytes, 0);
          sum += ws_layout_bytes(b.bytes);
          if (b.id == WsBuf::Qpe) {
            EXPECT_EQ(b.bytes, rope_queries ? T * in.dims.heads * in.dims.rope * 2 : 1);
          }
          if (b.id == WsBuf::Gu) {
            EXPECT_EQ(b.bytes, dense_experts ? in.dims.experts * T * 2 * in.dims.moe_inter * 2 : 0);
          }
        }
        for (size_t id = 0; id < seen.size(); ++id) {
          const bool fp8_only = id == size_t(WsBuf::Iq8) || id == size_t(WsBuf::Iw8);
          EXPECT_EQ(seen[id], fp8_only && !fp8 ? 0 : 1) << "buffer " << id;
        }
        const RunnerWorkspace w = runner_workspace(in, T, L);
        EXPECT_EQ(w.total(), sum);
        EXPECT_EQ(ws_layout_bytes(0), 256);
        EXPECT_EQ(ws_layout_bytes(257), 512);
      }
}

// ---------------------------------------------------------------------------------------------
// Issue 44's remaining gap: the KV the caller needs comes before the prefill workspace. The
// 13-layer GLM-5-dims model (3 dense + 10 MoE, 64.88 GB of weights, 13 x 1408 = 18304 B/token
// BF16) on an H100 as measured (tools/device/queue_memplan.sh at ff39793): cudaMemGetInfo's
// 85.02 GB, 0.69 GB in use before the load, --mem-fraction-static 0.88.
namespace {

constexpr int64_t kH100Cuda = 85'020'000'000, kInUseBefore = 690'000'000, kWeights13 = 64'880'000'000;

struct BenchRun {
  std::vector<int64_t> batch, ctx, prefill, k;
  bool fp8 = false;
  double fraction = 0.88;
};

// bench step's plan (cmd_bench_step.cpp's RunnerOptions -> GpuRunner::plan_input -> the first
// plan in GpuRunner::load, before the upload: in use = before the load + 0.5 GiB + 1 % of the
// weights for the load's overheads; no speculation).
RunnerPlanInput bench_step_input(const BenchRun& r) {
  RunnerPlanInput in;
  in.dims = glm5_dims(1, 13);
  if (r.fp8) {
    in.dims.kv_bytes_per_token = runner_kv_bytes_per_token(13, 13, 512, 64, 128, KvElem::FP8_E4M3, KvElem::FP8_E4M3);
    in.dims.fp8_index_queries = true;
  }
  in.device_bytes = kH100Cuda;
  in.in_use_bytes = kInUseBefore + (int64_t(512) << 20) + kWeights13 / 100;
  in.weight_bytes = kWeights13;
  in.mem_fraction_static = r.fraction;
  const int64_t max_b = *std::max_element(r.batch.begin(), r.batch.end());
  const int64_t max_p = *std::max_element(r.prefill.begin(), r.prefill.end());
  const int64_t max_l = std::max(*std::max_element(r.ctx.begin(), r.ctx.end()), max_p);
  const int64_t max_k = *std::max_element(r.k.begin(), r.k.end());
  in.max_tokens = std::max(max_b, max_p);
  in.min_tokens = std::max(max_b, std::min(kMinPrefillTokensPerStep, in.max_tokens));
  in.max_logits_rows = in.max_requests = in.min_score_rows = max_b;
  in.max_context = max_l + max_k;
  in.max_decode_steps = max_k;
  in.graph_buckets = buckets(max_b);
  in.tokens_flag = "--prefill / --batch";
  in.kv_flag = "--ctx / --batch";
  for (int64_t L : r.ctx)
    for (int64_t B : r.batch)
      in.kv_needs.push_back({kv_tokens_for_batch(B, L - 1 + max_k, 64), fmt::format("B {} x {} ctx decode", B, L)});
  for (int64_t P : r.prefill) in.kv_needs.push_back({kv_tokens_for_batch(1, P, 64), fmt::format("prefill {}", P)});
  return in;
}

// The pool of a plan, in tokens (pages of 64, one of them the padding rows').
int64_t pool_tokens(const RunnerPlan& p) { return (p.kv_tokens / 64 - 1) * 64; }

}  // namespace

TEST(RunnerMemoryPlan, TheKvPoolHoldsTheDecodePointsBeforeThePrefillWorkspaceGrows) {
  // Run 1 of the gap: --batch 1,8 --ctx 32768 --prefill 1024,4096,16384 --k 1,8. Before,
  // the plan gave the workspace 9093 tokens/step (7.41 GB) and the pool 89792 tokens: B 8 x 32K
  // (8 x 513 pages = 262656 tokens, 4.81 GB) was skipped.
  const RunnerPlanInput in = bench_step_input({{1, 8}, {32768}, {1024, 4096, 16384}, {1, 8}});
  RunnerPlanInput before = in;
  before.kv_needs.clear();  // the old plan: one request at the full context only
  const RunnerPlan old = plan_runner_memory(before), p = plan_runner_memory(in);
  std::printf("32K, before: %s; KV pool %lld tokens\n", old.describe().c_str(), (long long)pool_tokens(old));
  std::printf("32K, now:    %s; KV pool %lld tokens\n", p.describe().c_str(), (long long)pool_tokens(p));
  ASSERT_TRUE(old.ok && p.ok) << old.error << p.error;
  EXPECT_LT(pool_tokens(old), 262656);
  EXPECT_EQ(kv_tokens_for_batch(8, 32768 - 1 + 8, 64), 262656);
  EXPECT_GE(pool_tokens(p), 262656);  // B 8 x 32K runs
  EXPECT_TRUE(p.tokens_lowered && p.lowered_for_kv);
  EXPECT_EQ(p.kv_need_tokens, 262656 + 64);
  EXPECT_TRUE(p.kv_needs_unmet.empty());
  EXPECT_NE(p.describe().find(fmt::format("({} tokens/step, lowered from 16384 to leave the KV pool 262720 tokens for "
                                          "B 8 x 32768 ctx decode,",
                                          p.max_tokens)),
            std::string::npos)
      << p.describe();
  EXPECT_GE(p.max_tokens, 1024);  // the 1024 prefill still runs
  EXPECT_LT(p.max_tokens, old.max_tokens);
  EXPECT_LE(p.ws.total(), p.workspace_budget);
  // The largest: one token more per step and the pool would not hold B 8 x 32K.
  const int64_t beside = int64_t(std::floor(double(kH100Cuda) * 0.88)) - in.in_use_bytes - kWeights13 - p.graph_bytes;
  EXPECT_LE(p.ws.total() + p.kv_need_tokens * 18304, beside);
  EXPECT_GT(runner_workspace(in, p.max_tokens + 1, 8).total() + p.kv_need_tokens * 18304, beside);

  // The 128K B 1 case (--batch 1 --ctx 131072 --prefill 1024,4096): its one request is the
  // smallest pool the plan always kept, so nothing changes.
  const RunnerPlanInput in128 = bench_step_input({{1}, {131072}, {1024, 4096}, {1, 8}});
  RunnerPlanInput old128_in = in128;
  old128_in.kv_needs.clear();
  const RunnerPlan p128 = plan_runner_memory(in128), old128 = plan_runner_memory(old128_in);
  std::printf("128K: %s; KV pool %lld tokens\n", p128.describe().c_str(), (long long)pool_tokens(p128));
  ASSERT_TRUE(p128.ok) << p128.error;
  EXPECT_EQ(p128.max_tokens, old128.max_tokens);
  EXPECT_EQ(p128.kv_tokens, old128.kv_tokens);
  EXPECT_GE(pool_tokens(p128), 131072 + 8);

  // The issue's first row (--batch 1,8,64,256 --ctx 1024 --prefill 4096): B 256 was skipped ("the
  // KV pool holds 212608 tokens"); 256 x 17 pages = 278528 tokens now fit beside 4096 tokens/step.
  const RunnerPlan p1k = plan_runner_memory(bench_step_input({{1, 8, 64, 256}, {1024}, {4096}, {1, 8}}));
  std::printf("1K: %s; KV pool %lld tokens\n", p1k.describe().c_str(), (long long)pool_tokens(p1k));
  ASSERT_TRUE(p1k.ok) << p1k.error;
  EXPECT_GE(pool_tokens(p1k), 278528);
  EXPECT_TRUE(p1k.kv_needs_unmet.empty());
}

TEST(RunnerMemoryPlan, ADecodePointNoTokensPerStepLeaveRoomForIsPassedOver) {
  // Run 2: --batch 1,64 --ctx 8192 (--prefill 1024 --k 1,8). B 64 x 8K takes 64 x 129 pages =
  // 528384 tokens: 9.67 GB in BF16, more than the 7.9 GB beside the weights and graphs at any
  // tokens per step; the plan keeps the next point (B 1) and says which one it could not.
  const RunnerPlan bf = plan_runner_memory(bench_step_input({{1, 64}, {8192}, {1024}, {1, 8}}));
  std::printf("8K BF16: %s; KV pool %lld tokens\n", bf.describe().c_str(), (long long)pool_tokens(bf));
  ASSERT_TRUE(bf.ok) << bf.error;
  EXPECT_EQ(kv_tokens_for_batch(64, 8192 - 1 + 8, 64), 528384);
  EXPECT_LT(pool_tokens(bf), 528384);
  EXPECT_EQ(bf.max_tokens, 1024);  // asked 1024: the floor itself
  ASSERT_EQ(bf.kv_needs_unmet.size(), 1u);
  EXPECT_EQ(bf.kv_needs_unmet[0], "B 64 x 8192 ctx decode (528448 tokens)");
  EXPECT_NE(bf.describe().find("; no tokens/step leave the KV pool room for B 64 x 8192 ctx decode (528448 tokens)"),
            std::string::npos);
  // FP8 (9152 B/token): the same point takes 4.84 GB and runs (issue 40's comparison point in FP8).
  const RunnerPlan f8 = plan_runner_memory(bench_step_input({{1, 64}, {8192}, {1024}, {1, 8}, true}));
  std::printf("8K FP8:  %s; KV pool %lld tokens\n", f8.describe().c_str(), (long long)pool_tokens(f8));
  ASSERT_TRUE(f8.ok) << f8.error;
  EXPECT_GE(pool_tokens(f8), 528384);
  EXPECT_TRUE(f8.kv_needs_unmet.empty());
  // After the upload the plan runs again with what is measured: in the 32K run above the workspace,
  // graphs and pool took 7.41 + 0.07 + 1.64 GB of 0.88 x 85.02 GB, so 65.70 GB were in use (weights
  // and the attention kernels' workspaces; ~1.06 GB under the first plan's 66.76 GB estimate).
  // There B 64 x 6K (64 x 97 pages = 397312 tokens, 7.27 GB) fits in BF16 too, B 64 x 8K still
  // not: queue_memplan.sh's kv_bf16 / kv_fp8 pair compares B 64 at 6K (and FP8 alone at 8K).
  for (bool fp8 : {false, true}) {
    RunnerPlanInput m = bench_step_input({{1, 64}, {6144, 8192}, {1024}, {1, 8}, fp8});
    m.in_use_bytes = int64_t(std::floor(double(kH100Cuda) * 0.88)) - 9'120'000'000;
    m.weight_bytes = 0;
    const RunnerPlan q = plan_runner_memory(m);
    std::printf("measured, %s: %s; KV pool %lld tokens\n", fp8 ? "FP8" : "BF16", q.describe().c_str(),
                (long long)pool_tokens(q));
    ASSERT_TRUE(q.ok) << q.error;
    EXPECT_GE(pool_tokens(q), kv_tokens_for_batch(64, 6144 - 1 + 8, 64));
    EXPECT_EQ(pool_tokens(q) >= 528384, fp8);
  }
}

TEST(RunnerMemoryPlan, BenchStepRefusalsNameWhatToChange) {
  // The weights alone: 0.78 x 85.02 GB less 1.88 GB in use is 64.44 GB < 64.88 GB.
  BenchRun r{{1}, {200000}, {1024, 4096}, {1}};
  r.fraction = 0.78;
  const RunnerPlan w = plan_runner_memory(bench_step_input(r));
  EXPECT_FALSE(w.ok);
  EXPECT_EQ(w.error.rfind("memory plan: the weights (64.88 GB) do not fit 0.78 x the device's 85.02 GB less 1.88 GB "
                          "in use = 64.44 GB; raise --mem-fraction-static",
                          0),
            0u)
      << w.error;
  // queue_memplan.sh's refusal run: a fraction that leaves 2 GB beside the weights and the load's
  // estimated overheads, of nvidia-smi's total (81559 MiB, above cudaMemGetInfo's 85.02 GB):
  // F = (1.01 x weights + used (0 MiB) + a CUDA context 0.7 GB + 0.54 GB + 2.0 GB) / total. One
  // 200K request's KV is 200128 x 18304 B = 3.66 GB: no tokens per step leave room for it.
  r.fraction = std::round((1.01 * double(kWeights13) + 0.0 + 0.7e9 + 0.54e9 + 2.0e9) / (81559.0 * 1048576.0) * 1000) /
               1000;  // (the script's round(..., 3))
  EXPECT_EQ(r.fraction, 0.804);
  const RunnerPlan k = plan_runner_memory(bench_step_input(r));
  std::printf("refused at %.3f: %s\n", r.fraction, k.error.c_str());
  EXPECT_FALSE(k.ok);
  EXPECT_EQ(k.error.find('\n'), std::string::npos);
  EXPECT_EQ(k.error.rfind("memory plan: weights 64.88 GB + workspace ", 0), 0u) << k.error;
  EXPECT_NE(k.error.find("(1024 tokens/step, the fewest) + graphs ~0.02 GB + the smallest KV pool 3.66 GB (one "
                         "request of 200001 tokens; 200128 tokens with the padding page at 18304 B/token)"),
            std::string::npos)
      << k.error;
  EXPECT_NE(k.error.find(" > 0.804 x the device's 85.02 GB less 1.88 GB in use = 66.48 GB; lower --ctx / --batch (about "),
            std::string::npos)
      << k.error;
  EXPECT_NE(k.error.find("--max-running-requests, or raise --mem-fraction-static"), std::string::npos) << k.error;
  // Where the fewest tokens per step are what was asked, the refusal also names the tokens' flag.
  r.prefill = {1024};
  RunnerPlanInput fixed = bench_step_input(r);
  fixed.min_tokens = 0;
  const RunnerPlan f = plan_runner_memory(fixed);
  EXPECT_FALSE(f.ok);
  EXPECT_NE(f.error.find("(1024 tokens/step) + graphs"), std::string::npos) << f.error;
  EXPECT_NE(f.error.find("--max-running-requests or --prefill / --batch (a smaller workspace), or raise"),
            std::string::npos)
      << f.error;
}

TEST(RunnerMemoryPlan, WhenEveryStatedNeedIsTooLargeOneRequestAtTheFullContextStillRuns) {
  // --batch 64 --ctx 8192 alone (BF16): the only decode point is passed over, the plan keeps one
  // request at the full context (the prefill points run) rather than refusing the run.
  const RunnerPlan p = plan_runner_memory(bench_step_input({{64}, {8192}, {1024}, {1, 8}}));
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.kv_need_what, "one request of 8200 tokens");
  EXPECT_EQ(p.kv_need_tokens, (8200 + 63) / 64 * 64 + 64);
  ASSERT_EQ(p.kv_needs_unmet.size(), 1u);
  EXPECT_EQ(p.kv_needs_unmet[0], "B 64 x 8192 ctx decode (528448 tokens)");
  // serve's sizing states no need: one request of --context-length, and the same plan as stating it.
  RunnerPlanInput s = serve_input(kH100, 32768, 64);
  const RunnerPlan a = plan_runner_memory(s);
  s.kv_needs = {{32768, "one request of --context-length"}};
  const RunnerPlan b = plan_runner_memory(s);
  ASSERT_TRUE(a.ok && b.ok);
  EXPECT_EQ(a.kv_tokens, b.kv_tokens);
  EXPECT_EQ(a.describe(), b.describe());
  EXPECT_EQ(a.kv_need_what, "one request of 32768 tokens");
  EXPECT_TRUE(b.kv_needs_unmet.empty());
}
