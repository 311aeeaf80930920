// fp4moe bench step --model DIR [--batch 1,8,64,256,1024] [--ctx 1024,8192] [--prefill 1024,4096,16384]
//                   [--k 1,2,4,8] [--json FILE]
//
// Times the GPU runner's model step on a checkpoint (e.g. make-synthetic --preset glm5-layer):
//   - decode steps at batch B × context L (every request one token at position L-1; replayed
//     from the decode graphs up to the largest B), host-inclusive (metadata upload + launch +
//     results back), the device time of one such step (cudaEvents from the upload to the
//     results) and the host's share (wall − device);
//   - the same step eager with cudaEvents between its stages (attention, indexer, MoE, dense
//     MLP, lm_head, sampling): each stage's share of that eager pass;
//   - K greedy decode steps per launch (GpuRunner::decode_greedy) for each K: ms per token step;
//   - prefill steps of one request of P tokens;
//   - with --token-masks: each decode point again with a grammar mask on every request
//     (StepInput::token_masks: random words, 1/8 of the vocabulary allowed, so 7/8 of each row is
//     stored as -inf: near the kernel's most bytes), host-inclusive and device ms, and the ratio
//     to the unmasked step (issue 42's target: <= 1.05 at B 64). The host's mask fill (grammar/)
//     is not in it: `bench grammar` times that.
//   - with --speculative-algorithm NEXTN (--speculative-num-steps N): at each decode point the
//     verify step (B x (N + 1) one-token rows sharing each request's pages, graph-replayed within
//     the buckets) against the decode step, one MTP draft step (its graph, logits read back) against
//     the MTP layer's all-weights byte floor, and tokens/s at accept lengths 1 .. N + 1 from them;
//     then whole greedy rounds (MtpSpeculator over GpuSpecSteps): the host round (logits of every
//     step back to the host) beside the device round (GpuRunner::spec_round_greedy, one readback).
// Floors: all weight bytes + the KV bytes read at the measured copy bandwidth (an upper bound
// of the bytes a decode step touches: at small B only the hit experts are read).
// Memory: the runner's plan keeps the KV pool for the largest decode point it can hold before the
// prefill workspace grows (the tokens per step lowered down to 1024 or the largest batch's rows);
// decode points the pool cannot hold and prefills longer than the tokens per step are skipped,
// each said in its table row (the plan line names the points no tokens per step left room for).
#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "core/error.hpp"
#include "engine/speculative_options.hpp"

#if defined(FP4MOE_HAVE_GPU_RUNNER)
#include <cuda_runtime_api.h>

#include <nlohmann/json.hpp>

#include "cuda/bench/bench_util.hpp"
#include "cuda/common/device.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/cuda/gpu_spec_steps.hpp"
#include "backend/decode_rows.hpp"
#endif

namespace fp4moe::cli {
namespace {


struct BenchStepArgs {
  std::string model;
  std::vector<int64_t> batch = {1, 8, 64, 256, 1024}, ctx = {1024, 8192}, prefill = {1024, 4096, 16384};
  std::vector<int64_t> k = {1, 2, 4, 8};
  std::string json;
  int iters = 20;
  double mem_fraction_static = 0.88;
  std::string attention_kernels = "auto";
  std::string kv_cache_dtype = "auto";
  int64_t replicate_layers = 0;
  bool token_masks = false;
  engine::SpeculativeFlags speculative;
  int32_t spec_steps = 0;  // N of --speculative-num-steps when --speculative-algorithm is on
  bool quantize_draft_experts = true;  // --speculative-draft-model-quantization nvfp4 (the default)
};

#if defined(FP4MOE_HAVE_GPU_RUNNER)
// bench step's speculative rounds: wall ms of one greedy round of B requests at start L - 1 (pages
// pp / pi, last tokens tok) through MtpSpeculator over GpuSpecSteps, host round then device round
// (GpuSpecSteps::device_rounds), iters each after one warm-up; the MTP state (a pair at L - 2 with
// the states `hin`) is queued and run again, untimed, before every round.
// Wall ms of a host round, of a device round, and the device round's GPU time (its events: the
// wall time beyond it is the host's, e.g. the first draft drawn from the host MTP step's logits
// that this bench's state set-up leaves; in serving, a device round follows a device round and
// takes its draft from the device).
std::array<double, 3> time_spec_rounds(engine::gpu::GpuRunner& r, const std::vector<int32_t>& tok,
                                           const std::vector<int32_t>& pp, const std::vector<int32_t>& pi, int64_t B,
                                           int64_t L, int64_t N, const std::vector<float>& hin, int iters) {
  engine::gpu::GpuSpecSteps steps(r);
  model::MtpSpeculator spec(steps, int32_t(N));
  const int64_t H = r.config().hidden;
  std::vector<model::SpecRequest> reqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    model::SpecRequest& q = reqs[size_t(b)];
    q.id = uint64_t(b + 1);
    q.start = int32_t(L - 1);
    q.last_token = tok[size_t(b)];
    q.pages = std::span<const int32_t>(pi.data() + pp[size_t(b)], size_t(pp[size_t(b) + 1] - pp[size_t(b)]));
    q.max_new = int32_t(N + 1);
    q.sampling.temperature = 0.0f;
  }
  double ms[2] = {0.0, 0.0}, gpu_first = 0.0;  // gpu_first: the GPU ms summed once the untimed round ran
  for (int device = 0; device < 2; ++device) {
    steps.device_rounds = device == 1;
    for (int i = 0; i <= iters; ++i) {
      for (int64_t b = 0; b < B; ++b) {
        const int32_t prev = tok[size_t((b + 1) % B)];
        spec.add_target_rows(uint64_t(b + 1), int32_t(L - 2), std::span<const int32_t>(&prev, 1), hin.data() + b * H,
                             tok[size_t(b)], reqs[size_t(b)].pages);
      }
      spec.run_queued();
      const auto t0 = std::chrono::steady_clock::now();
      spec.round(reqs);
      if (i > 0) ms[device] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      else gpu_first = steps.device_round_gpu_ms;
    }
    ms[device] /= iters;
  }
  return {ms[0], ms[1], (steps.device_round_gpu_ms - gpu_first) / iters};
}

// Multiply-adds x 2 of one token that attends `ctx` positions (a DSA layer at most index_topk),
// through every layer and the lm_head (logits: one row per token when `logits`): the linears as
// absorbed MLA decode runs them (q_a, q_b, kv_a, q_nope -> latent, scores and values over the
// latent + rope, latent -> v, o), the indexer's projections and scores, the dense MLP or the
// router + top_k routed + shared experts. The step's FLOP floor at the BF16 peak.
double token_flops(const model::MlaModelConfig& c, double ctx, bool logits) {
  const double H = double(c.hidden), nh = double(c.num_heads), ckv = double(c.kv_lora_rank),
               rope = double(c.qk_rope_dim), nope = double(c.qk_nope_dim), v = double(c.v_head_dim);
  double f = 0.0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool dsa = c.indexer[size_t(l)] != model::IndexerKind::None;
    const double kv = dsa ? std::min(ctx, double(c.index_topk)) : ctx;
    double m = c.q_lora_rank > 0 ? H * double(c.q_lora_rank) + double(c.q_lora_rank) * nh * (nope + rope)
                                 : H * nh * (nope + rope);
    m += H * (ckv + rope) + nh * nope * ckv + nh * kv * (ckv + rope) + nh * kv * ckv + nh * ckv * v + nh * v * H;
    if (c.indexer[size_t(l)] == model::IndexerKind::Full) {
      const double ih = double(c.index_n_heads), id = double(c.index_head_dim);
      m += double(c.q_lora_rank) * ih * id + H * id + H * ih + ih * ctx * id;
    }
    if (c.moe_layer[size_t(l)])
      m += H * double(c.moe.num_experts) +
           3.0 * H * (double(c.moe.top_k) * double(c.moe.inter) + double(c.moe.shared_inter));
    else
      m += 3.0 * H * double(c.intermediate);
    f += m;
  }
  return 2.0 * (f + (logits ? H * double(c.vocab) : 0.0));
}

int run_bench_step(const BenchStepArgs& a) {
  FP4MOE_CHECK(cuda::device_available(), "bench step needs a CUDA GPU, and none is visible");
  FP4MOE_CHECK(!a.batch.empty() && !a.ctx.empty() && a.iters >= 1, "bench step: --batch / --ctx empty or --iters < 1");
  for (int64_t k : a.k) FP4MOE_CHECK(k >= 1 && k <= 64, "bench step: --k {}: 1 .. 64", k);
  const int64_t max_k = a.k.empty() ? 1 : *std::max_element(a.k.begin(), a.k.end());
  const int64_t max_b = *std::max_element(a.batch.begin(), a.batch.end());
  const int64_t max_p = a.prefill.empty() ? 1 : *std::max_element(a.prefill.begin(), a.prefill.end());
  const int64_t max_l = std::max(*std::max_element(a.ctx.begin(), a.ctx.end()), max_p);
  const int64_t N = a.spec_steps, max_v = max_b * (N + 1);  // the verify step's rows: B x (N + 1)
  engine::gpu::RunnerOptions ro;
  ro.max_requests = max_v;
  // The tokens per step from the plan: the longest --prefill asked, lowered (down to 1024 or the
  // largest batch's rows, the larger) where the workspace would not fit its budget, or would not
  // leave the KV pool the pages of the largest decode point it can hold (a KV need each; a point
  // whose pages no tokens per step leave room for is passed over, said in the plan line, and
  // skipped in the table). A prefill's pages are one request's, at most the longest context's,
  // which the plan always keeps. Longer prefills than the plan's tokens per step are skipped.
  ro.max_tokens = std::max(max_v, max_p);
  ro.min_tokens = std::max(max_v, std::min(engine::kMinPrefillTokensPerStep, ro.max_tokens));
  ro.max_logits_rows = max_v;  // one row per request (a prefill asks for its last; a verify step every row)
  ro.tokens_flag = "--prefill / --batch";
  ro.max_context = max_l + std::max(max_k, N + 1);
  const int64_t ps0 = ro.page_size;
  for (int64_t L : a.ctx)  // K decode steps write positions L-1 .. L-2+K; a verify step L-1 .. L-1+N
    for (int64_t B : a.batch)
      ro.kv_needs.push_back({engine::kv_tokens_for_batch(B, L - 1 + std::max(max_k, N + 1), ps0),
                             fmt::format("B {} x {} ctx decode", B, L)});
  ro.kv_flag = "--ctx / --batch";
  ro.mtp = N > 0;
  ro.quantize_mtp_experts = a.quantize_draft_experts;
  ro.max_decode_steps = int32_t(max_k);
  ro.mem_fraction_static = a.mem_fraction_static;
  ro.cuda_graph_max_bs = max_v;  // a verify step replays the decode graph of its B x (N + 1) rows
  ro.attention_kernels = engine::gpu::parse_attention_kernels(a.attention_kernels);
  ro.kv_elem = engine::gpu::parse_kv_cache_dtype(a.kv_cache_dtype);
  ro.replicate_layers = a.replicate_layers;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = engine::gpu::GpuRunner::load(a.model, ro);
  if (r->options().max_tokens < ro.max_tokens)
    fmt::print("memory plan: {} tokens per step fit (of {} asked): longer --prefill rows are skipped\n",
               r->options().max_tokens, ro.max_tokens);
  fmt::print("start-up (load + plan + graphs): {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  cudaStream_t s = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamCreate(&s));
  const cuda::bench::Ceilings ceil = cuda::bench::measure_ceilings(s, 5);
  // Random keys in every page: a zeroed pool ties every indexer score, and a row of ties takes
  // the top-k's slow path (one CTA streams the row: ~184 us a layer at 128K on an H100, 23x the
  // sampled path) that a real cache does not. BF16 pools: ~normal values; FP8 E4M3 pools: bytes
  // 0x00..0x3E (0 .. 1.75, never the NaN codes 0x7F / 0xFF).
  if (ro.kv_elem == KvElem::FP8_E4M3)
    cuda::bench::fill_random_u8(r->kv_pool_data(), r->kv_pool_bytes(), 11, 0x00, 0x3E, s);
  else
    cuda::bench::fill_random_bf16(r->kv_pool_data(), r->kv_pool_bytes() / 2, 11, 1.0f, s);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  fmt::print("ceilings: copy {:.0f} GB/s, BF16 {:.0f} TFLOP/s; KV cache {} ({} B/token)\n", ceil.copy_gbps,
             ceil.bf16_tflops, kv_elem_name(ro.kv_elem), r->kv_bytes_per_token());
  const int64_t V = r->config().vocab, ps = r->page_size();
  auto time_step = [&](const engine::gpu::StepInput& in, int iters) {
    r->step(in, {});
    const auto a0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) r->step(in, {});
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a0).count() / iters;
  };
  nlohmann::json jdecode = nlohmann::json::array(), jprefill = nlohmann::json::array();
  std::string stage_table = "| decode B | ctx | eager ms |", k_table = "| decode B | ctx |";
  for (int i = 0; i < engine::gpu::kNumStepStages; ++i)
    stage_table += fmt::format(" {} % |", engine::gpu::step_stage_name(engine::gpu::StepStage(i)));
  stage_table += " host % (graph) |\n|---|---|---|";
  for (int i = 0; i <= engine::gpu::kNumStepStages; ++i) stage_table += "---|";
  stage_table += "\n";
  std::string spec_table =
      fmt::format("| decode B | ctx | decode ms | verify ms ({} rows/request) | verify / decode | verify graph | draft "
                  "ms | draft all-weights floor ms | draft / floor |",
                  N + 1);
  for (int64_t acc = 1; acc <= N + 1; ++acc) spec_table += fmt::format(" tok/s at accept {} |", acc);
  spec_table += " host round ms | device round ms | host / device | device round GPU ms |";
  spec_table += "\n|---|---|---|---|---|---|---|---|---|";
  for (int64_t acc = 1; acc <= N + 1; ++acc) spec_table += "---|";
  spec_table += "---|---|---|---|";
  spec_table += "\n";
  std::string mask_table =
      "| decode B | ctx | ms/step | masked ms/step | ratio | device ms | masked device ms | device ratio |\n"
      "|---|---|---|---|---|---|---|---|\n";
  for (int64_t k : a.k) k_table += fmt::format(" K={} ms/step |", k);
  k_table += "\n|---|---|";
  for (size_t i = 0; i < a.k.size(); ++i) k_table += "---|";
  k_table += "\n";
  const model::MlaModelConfig& mc = r->config();
  const double eb = double(r->routed_expert_bytes());
  // The KV one request's decode step reads at context L. With DSA (an indexer and index_topk),
  // attention reads the latents of its top-k rows only (min(L, topk)) and the indexer layers read
  // every index key; without it every layer's latents. target_kv_bytes_per_token() = every
  // layer's latents + the indexer layers' index keys, so the keys' share is the rest.
  const double latent_per_token =
      double((mc.kv_lora_rank + mc.qk_rope_dim) * int64_t(kv_elem_size(ro.kv_elem)) * mc.num_layers);
  const double index_per_token = double(r->target_kv_bytes_per_token()) - latent_per_token;
  const bool sparse_kv = mc.has_indexer() && mc.index_topk > 0 && index_per_token > 0;
  auto kv_read_bytes = [&](int64_t L) {
    if (!sparse_kv) return double(L) * double(r->target_kv_bytes_per_token());
    return double(std::min<int64_t>(L, mc.index_topk)) * latent_per_token + double(L) * index_per_token;
  };
  fmt::print("floors: bytes = the weights the step touches (all but the routed experts no token chose, from the "
             "step's per-expert counts) + the KV the step reads ({}), at the copy ceiling; FLOPs at the BF16 "
             "peak; floor = the larger\n"
             "| decode B | ctx | ms/step | device ms | tok/s | experts touched % | byte floor ms | FLOP floor ms | x "
             "floor | all-weights floor ms | graph |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
             sparse_kv ? fmt::format("DSA: min(ctx, {}) rows of latents + every index key, {:.0f} + {:.0f} B/token",
                                     mc.index_topk, latent_per_token, index_per_token)
                       : fmt::format("every layer's latents of the context, {} B/token", r->target_kv_bytes_per_token()));
  for (int64_t L : a.ctx)
    for (int64_t B : a.batch) {
      // K decode steps write positions L-1 .. L-2+K; a verify step L-1 .. L-1+N
      const int64_t per = engine::kv_tokens_for_batch(1, L - 1 + std::max(max_k, N + 1), ps) / ps;  // as its KV need
      if (B * per > r->free_pages()) {
        fmt::print("| {} | {} | skipped: the KV pool holds {} tokens | | | | | |\n", B, L, r->num_pages() * ps);
        continue;
      }
      // Distinct tokens per request (identical rows would route alike: 8 experts for any batch).
      std::vector<int32_t> tok(static_cast<size_t>(B)), qo, pp{0}, pi, rows;
      for (int64_t b = 0; b < B; ++b) tok[size_t(b)] = int32_t(7 + (b * 7919) % (V - 7));
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
      double dev_ms = 0.0;
      std::vector<int32_t> counts;
      engine::gpu::StepOutput o;
      o.device_ms = &dev_ms;
      o.expert_counts = &counts;
      r->step(in, o);
      int64_t untouched = 0;
      for (int32_t n : counts) untouched += n == 0;
      const double touched_share =
          counts.empty() ? 1.0 : 1.0 - double(untouched) / double(counts.size());
      // Stages: an eager pass with events (the first creates them, the second is timed).
      engine::gpu::StageTimes st;
      o = {};
      o.stages = &st;
      r->step(in, o);
      r->step(in, o);
      // The target's bytes: an MTP layer loaded for the speculative tables is not part of its step.
      const double kv = double(B) * kv_read_bytes(L);
      const double all_floor = (double(r->target_weight_bytes()) + kv) / (ceil.copy_gbps * 1e9) * 1e3;
      const double byte_floor =
          (double(r->target_weight_bytes()) - double(untouched) * eb + kv) / (ceil.copy_gbps * 1e9) * 1e3;
      const double flop_floor = double(B) * token_flops(mc, double(L), true) / (ceil.bf16_tflops * 1e12) * 1e3;
      const double floor = std::max(byte_floor, flop_floor);
      const double host = std::max(0.0, ms - dev_ms) / ms;
      fmt::print("| {} | {} | {:.3f} | {:.3f} | {:.0f} | {:.1f} | {:.3f} | {:.3f} | {:.2f} | {:.3f} | {} |\n", B, L,
                 ms, dev_ms, double(B) / ms * 1e3, 100.0 * touched_share, byte_floor, flop_floor, ms / floor,
                 all_floor, graph ? "yes" : "eager");
      nlohmann::json j{{"batch", B},
                       {"ctx", L},
                       {"ms_per_step", ms},
                       {"device_ms", dev_ms},
                       {"host_share", host},
                       {"experts_touched_share", touched_share},
                       {"byte_floor_ms", byte_floor},
                       {"flop_floor_ms", flop_floor},
                       {"floor_ms", floor},
                       {"all_weights_floor_ms", all_floor},
                       {"graph", graph},
                       {"eager_ms", st.total()}};
      stage_table += fmt::format("| {} | {} | {:.3f} |", B, L, st.total());
      for (int i = 0; i < engine::gpu::kNumStepStages; ++i) {
        const double share = st.total() > 0 ? st.ms[i] / st.total() : 0.0;
        stage_table += fmt::format(" {:.1f} |", 100.0 * share);
        j["stages_ms"][engine::gpu::step_stage_name(engine::gpu::StepStage(i))] = st.ms[i];
      }
      stage_table += fmt::format(" {:.1f} |\n", 100.0 * host);
      if (a.token_masks) {  // the same step with every request constrained
        const int64_t W = (V + 31) / 32;
        std::vector<uint32_t> words(size_t(B * W));
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (uint32_t& w : words) {  // three ANDed xorshift words: each bit set with probability 1/8
          uint32_t m = ~0u;
          for (int q = 0; q < 3; ++q) x ^= x << 13, x ^= x >> 7, x ^= x << 17, m &= uint32_t(x >> 11);
          w = m;
        }
        engine::gpu::StepInput mi = in;
        for (int64_t b = 0; b < B; ++b) mi.token_masks.push_back(words.data() + b * W);
        const double mms = time_step(mi, a.iters);
        double mdev = 0.0;
        engine::gpu::StepOutput mo;
        mo.device_ms = &mdev;
        r->step(mi, mo);
        mask_table += fmt::format("| {} | {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} |\n", B, L, ms, mms,
                                  mms / ms, dev_ms, mdev, mdev / dev_ms);
        j["masked_ms_per_step"] = mms;
        j["masked_device_ms"] = mdev;
      }
      // K steps per launch: pages for L-1+K positions per request (max_new = K, no stop ids).
      engine::gpu::DecodeInput di;
      di.tokens = tok.data();
      di.batch = in.batch;
      std::vector<int32_t> out, produced;
      k_table += fmt::format("| {} | {} |", B, L);
      for (int64_t k : a.k) {
        di.steps = int32_t(k);
        r->decode_greedy(di, out, produced);
        const int iters = std::max(1, a.iters / (2 * int(k)));
        const auto k0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) r->decode_greedy(di, out, produced);
        const double kms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - k0).count() / double(iters * k);
        k_table += fmt::format(" {:.3f} |", kms);
        j["k_ms_per_step"][std::to_string(k)] = kms;
      }
      k_table += "\n";
      if (N > 0) {  // the verify step (B x (N + 1) one-token rows) and one MTP draft step
        std::vector<int32_t> vtok, vpos, vqo{0}, vlen, vrows;
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t k = 0; k <= N; ++k) {
            vtok.push_back(int32_t(7 + ((b + 1) * 7919 + k * 104729) % (V - 7)));
            vpos.push_back(int32_t(L - 1 + k));
            vrows.push_back(int32_t(vrows.size()));
          }
          vqo.push_back(int32_t(vtok.size()));
          vlen.push_back(int32_t(L + N));
        }
        const KvBatchView vb{B, B * (N + 1), vqo.data(), vpos.data(), vlen.data(), pp.data(), pi.data()};
        const engine::DecodeRows dr = engine::decode_rows(vb, ps);
        engine::gpu::StepInput vin;
        vin.tokens = vtok.data();
        vin.batch = dr.view(vb);
        vin.logits_rows = vrows;
        const int64_t v0 = r->stats().graph_steps;
        const double vms = time_step(vin, a.iters);
        const bool vgraph = r->stats().graph_steps > v0;
        // One draft step: B tokens at position L-1 (the MTP layer's own state as input), logits back.
        const int64_t Hd = mc.hidden;
        std::vector<float> hin(size_t(B * Hd)), lg;
        for (size_t i = 0; i < hin.size(); ++i) hin[i] = float(int64_t((i * 2654435761u) % 2001) - 1000) / 1000.0f;
        engine::gpu::MtpStepInput min;
        min.tokens = tok.data();
        min.h_in = hin.data();
        min.batch = in.batch;
        min.logits_rows = rows;
        r->mtp_step(min, {&lg, nullptr});
        const auto d0 = std::chrono::steady_clock::now();
        for (int i = 0; i < a.iters; ++i) r->mtp_step(min, {&lg, nullptr});
        const double dms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count() / a.iters;
        const double dfloor =
            (double(r->mtp_weight_bytes()) + double(B * L * r->mtp_kv_bytes_per_token())) / (ceil.copy_gbps * 1e9) * 1e3;
        spec_table += fmt::format("| {} | {} | {:.3f} | {:.3f} | {:.2f} | {} | {:.3f} | {:.3f} | {:.2f} |", B, L, ms, vms,
                                  vms / ms, vgraph ? "yes" : "eager", dms, dfloor, dms / dfloor);
        // A round: the verify step + N MTP steps (N - 1 chained drafts, the catch-up over the emitted tokens).
        const double round_ms = vms + double(N) * dms;
        for (int64_t acc = 1; acc <= N + 1; ++acc) {
          spec_table += fmt::format(" {:.0f} |", double(B * acc) / round_ms * 1e3);
          j["speculative"]["tok_s_at_accept"][std::to_string(acc)] = double(B * acc) / round_ms * 1e3;
        }
        // Whole greedy rounds through MtpSpeculator over GpuSpecSteps at this point (start L - 1, N
        // drafts, max_new N + 1): the host round (every step's logits back, the host's argmax and
        // acceptance) and the device round (spec_round_greedy: one readback), wall ms each. The MTP
        // state (one pair at L - 2, untimed) is set again before every round.
        if (L >= 2) {
          const auto [host_ms, dev_ms, gpu_ms] = time_spec_rounds(*r, tok, pp, pi, B, L, N, hin, a.iters);
          spec_table += fmt::format(" {:.3f} | {:.3f} | {:.2f} | {:.3f} |", host_ms, dev_ms, host_ms / dev_ms, gpu_ms);
          j["speculative"]["host_round_ms"] = host_ms;
          j["speculative"]["device_round_ms"] = dev_ms;
          j["speculative"]["device_round_gpu_ms"] = gpu_ms;
        } else {
          spec_table += " - | - | - | - |";
        }
        spec_table += "\n";
        j["speculative"]["num_steps"] = N;
        j["speculative"]["verify_ms"] = vms;
        j["speculative"]["verify_graph"] = vgraph;
        j["speculative"]["draft_ms"] = dms;
        j["speculative"]["draft_floor_ms"] = dfloor;
      }
      jdecode.push_back(j);
      r->release_pages(pages);
    }
  fmt::print("\nper-stage device time of the decode step (an eager pass with cudaEvents between stages: shares of "
             "it; host % = (graph wall - graph device) / graph wall)\n{}",
             stage_table);
  if (!a.k.empty()) fmt::print("\nK greedy decode steps per launch (decode_greedy): ms per token step\n{}", k_table);
  if (N > 0)
    fmt::print("\nspeculative NEXTN {} steps: the verify step (one decode step of B x {} rows, backend/decode_rows.hpp) "
               "against the one-token decode step, and one MTP draft step (its graph within the buckets, its logits "
               "read back; floor: the MTP layer's weights with every routed expert + lm_head unless it has its own + its KV of the "
               "context, at the copy ceiling). tok/s at accept length a = B x a / (verify + {} draft-step costs); "
               "targets: verify <= 1.3x decode at B 1-16, <= 2x at B 64; draft <= 1.3x its floor\n{}",
               N, N + 1, N, spec_table);
  if (a.token_masks)
    fmt::print("\ngrammar masks on every request (1/8 of the vocabulary allowed; one upload + the mask launch "
               "inside the graph; target ratio <= 1.05 at B 64)\n{}",
               mask_table);
  fmt::print("\n| prefill P | ms | tok/s | FLOP floor ms (causal) | byte floor ms (all weights) | x floor |\n"
             "|---|---|---|---|---|---|\n");
  for (int64_t P : a.prefill) {
    const int64_t per = (P + ps - 1) / ps;
    if (P > r->options().max_tokens) {
      fmt::print("| {} | skipped: the memory plan fits {} tokens per step | | | | |\n", P, r->options().max_tokens);
      continue;
    }
    if (per > r->free_pages()) {
      fmt::print("| {} | skipped: the KV pool holds {} tokens | | | | |\n", P, r->num_pages() * ps);
      continue;
    }
    std::vector<int32_t> tok(static_cast<size_t>(P)), pos(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) tok[size_t(i)] = int32_t(7 + i * 37 % (V - 7)), pos[size_t(i)] = int32_t(i);
    std::vector<int32_t> pages = r->alloc_pages(per);
    const int32_t qo[2] = {0, int32_t(P)}, len[1] = {int32_t(P)}, pp[2] = {0, int32_t(per)};
    engine::gpu::StepInput in;
    in.tokens = tok.data();
    in.batch = {1, P, qo, pos.data(), len, pp, pages.data()};
    in.logits_rows = {int32_t(P - 1)};
    const double ms = time_step(in, std::max(1, a.iters / 4));
    // Causal: token i attends i + 1 positions, the mean (P + 1) / 2; one logits row.
    const double flops = double(P) * token_flops(mc, double(P + 1) / 2.0, false) + token_flops(mc, 0.0, true) -
                         token_flops(mc, 0.0, false);
    const double flop_floor = flops / (ceil.bf16_tflops * 1e12) * 1e3;
    const double byte_floor =
        (double(r->target_weight_bytes()) + double(P * r->target_kv_bytes_per_token())) / (ceil.copy_gbps * 1e9) * 1e3;
    fmt::print("| {} | {:.2f} | {:.0f} | {:.2f} | {:.2f} | {:.2f} |\n", P, ms, double(P) / ms * 1e3, flop_floor,
               byte_floor, ms / std::max(flop_floor, byte_floor));
    jprefill.push_back({{"tokens", P}, {"ms", ms}, {"flop_floor_ms", flop_floor}, {"byte_floor_ms", byte_floor}});
    r->release_pages(pages);
  }
  if (!a.json.empty()) {
    nlohmann::json j{{"model", a.model},
                     {"copy_gbps", ceil.copy_gbps},
                     {"bf16_tflops", ceil.bf16_tflops},
                     {"weight_bytes", r->weight_bytes()},
                     {"kv_cache_dtype", std::string(kv_elem_name(ro.kv_elem))},
                     {"kv_bytes_per_token", r->kv_bytes_per_token()},
                     {"decode", jdecode},
                     {"prefill", jprefill}};
    std::ofstream f(a.json);
    FP4MOE_CHECK(f.good(), "bench step: cannot write {}", a.json);
    f << j.dump(2) << "\n";
    fmt::print("wrote {}\n", a.json);
  }
  return 0;
}
#endif

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchStepArgs>();
  app.add_option("--model", a->model, "checkpoint folder (e.g. make-synthetic --preset glm5-layer)")->required();
  app.add_option("--batch", a->batch, "decode batch sizes")->delimiter(',');
  app.add_option("--ctx", a->ctx, "decode context lengths")->delimiter(',');
  app.add_option("--prefill", a->prefill, "prefill lengths (one request)")->delimiter(',');
  app.add_option("--k", a->k, "decode steps per launch (decode_greedy) to time, 1 .. 64 each (the runner is sized for the largest)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--json", a->json, "write the results as JSON here");
  app.add_option("--iters", a->iters, "timed steps per point")->capture_default_str();
  app.add_option("--mem-fraction-static", a->mem_fraction_static, "share of the device for weights + workspace + KV")
      ->capture_default_str();
  app.add_option("--attention-kernels", a->attention_kernels,
                 "auto: decode and top-k rows on FlashInfer's SM90 MLA over a device-built schedule (sm_90, 64 "
                 "heads, BF16 cache; the top-k rows of one-token steps on MlaDecodeMma), else (and over an "
                 "fp8_e4m3 cache) cuda/attention's "
                 "MlaDecodeMma, where the dims allow (+ cuda/indexer's scores); flashinfer-decode: FlashInfer for "
                 "every decode and top-k row, or an error; mma-decode: always MlaDecodeMma; wgmma-decode: its wgmma "
                 "variant (sm_90); wgmma-ws-decode: its warp-specialized wgmma variant (sm_90, "
                 "--kv-cache-dtype fp8_e4m3 only) (a forced kernel the GPU or the dims cannot run: refused); own: the runner's any-dims "
                 "kernels everywhere (the start-up line says which each layer takes)")
      ->check(CLI::IsMember({"auto", "own", "flashinfer-decode", "mma-decode", "wgmma-decode", "wgmma-ws-decode"}))
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", a->kv_cache_dtype,
                 "the KV cache: auto (bf16), bf16, or fp8_e4m3 (E4M3 latent, rope key and index keys: half the bytes "
                 "per token; the plan line shows the pool and the scales)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8_e4m3"}))
      ->capture_default_str();
  app.add_option("--replicate-layers", a->replicate_layers,
                 "run N layers: the checkpoint's, then copies of its MoE layers in turn, each in its own device "
                 "memory (a 3 dense + 2 MoE checkpoint times as 3 dense + N-3 MoE layers; 0: the checkpoint's)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--token-masks", a->token_masks,
               "also time each decode point with a grammar mask on every request (random, 1/8 of the vocabulary "
               "allowed) and print the ratio to the unmasked step (the host's mask fill is `bench grammar`'s)");
  // SGLang's speculative flags: with --speculative-algorithm NEXTN, every decode point also times
  // the verify step (B x (N + 1) rows) and one MTP draft step (the runner loads the MTP layer).
  app.add_option("--speculative-algorithm", a->speculative.algorithm, engine::kSpeculativeAlgorithmHelp);
  app.add_option("--speculative-num-steps", a->speculative.num_steps, engine::kSpeculativeNumStepsHelp);
  app.add_option("--speculative-eagle-topk", a->speculative.eagle_topk, engine::kSpeculativeEagleTopkHelp);
  app.add_option("--speculative-num-draft-tokens", a->speculative.num_draft_tokens, engine::kSpeculativeNumDraftTokensHelp);
  app.add_option("--speculative-draft-model-quantization", a->speculative.draft_model_quantization,
                 engine::kSpeculativeDraftModelQuantizationHelp)
      ->check(CLI::IsMember({"nvfp4", "unquant"}));
  run = [a] {
    a->spec_steps = engine::speculative_steps(a->speculative, "cuda", 1);  // the flags' own errors
    a->quantize_draft_experts = engine::quantize_draft_experts(a->speculative, a->spec_steps > 0);
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
