// The model on the GPU: GLM-5 / DeepSeek-V3 family (model/model_config.hpp) loaded from its
// safetensors shards into device memory, one memory plan, and the forward step over a flat
// batch of prefill chunks and decode tokens with a paged BF16 KV cache — the same step as the
// CPU backend's model::Model::step (its reference), with BF16 activations between ops and an
// FP32 residual stream.
//
// Start-up (GpuRunner::load):
//   1. config + weights bound in place (model::bind_weights over the mmap'd shards);
//   2. upload (gpu_loader.hpp: pinned staging, progress, GB/s): every linear gets its kernel
//      (cuda/linear/linear.hpp); MoE layers → moe::MoeLayerCuda (NVFP4/MXFP4 experts), or for BF16
//      experts the dense-over-experts fallback (every expert on every token through cuBLAS
//      batched GEMMs, then the routed combine; said once); a shared expert the MoE layer cannot
//      take (BF16 next to FP4 experts, NVIDIA's layout) runs as a dense MLP;
//   3. one memory plan (engine::plan_runner_memory, before any device allocation and again
//      after the upload with the measured sizes): weights, ONE workspace for the largest step
//      (activations, the MoE workspace shared by every layer, indexer scores, logits, sampling)
//      within workspace_fraction of the device (the tokens per step lowered to fit where
//      min_tokens allows), graphs (estimate), then the paged KV pool from what is left
//      (mem_fraction_static of the device, or max_total_tokens), at least one request at
//      max_context — one line; what does not fit is refused in one line before allocating;
//   4. CUDA graphs for decode per batch-size bucket up to cuda_graph_max_bs (timed; their
//      memory measured and reported).
//
// The step: every per-step array (tokens, positions, page tables, logits rows) goes to the
// device in ONE host→device copy into fixed buffers, so a decode step replays a captured graph
// (padding rows of a bucket belong to dummy requests whose cache writes go to a page of their
// own, never to a real request's). Results: logits rows (FP32, host) and/or the greedy token of
// each row, and/or tokens sampled on the device (cuda/sampling's sample(): StepInput::sampling,
// per-row parameters, penalties, seeds, logprobs; only tokens and logprobs come back); per-layer hidden states on request (eager only, for the layer-by-layer comparison
// with the CPU backend); per-expert token counts of every MoE layer (graph or eager); per-stage
// device times (eager, for bench step). decode_greedy runs K greedy decode steps per launch
// (the bucket's graph replayed K times, a device kernel advancing the batch in between);
// decode_sampled the same with sample() after each replay.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"
#include "backend/device_sampling.hpp"
#include "backend/runner_memory_plan.hpp"
#include "engine/request.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"
#include "model/speculative.hpp"
#include "tuner/attention_plan.hpp"

namespace fp4moe::engine::gpu {

// Which kernels run the absorbed MLA attention, the indexer and its top-k: the tuner's attention
// plan (tuner/attention_plan.hpp: the flag's values and what each means).
using tuner::AttentionKernels;
using tuner::parse_attention_kernels;  // --attention-kernels; an Error (one line) for another value

// SGLang's --kv-cache-dtype for the GPU runner: "auto" | "bf16" -> BF16, "fp8_e4m3" -> FP8_E4M3;
// an Error (one line) otherwise (f32 is the CPU reference's).
KvElem parse_kv_cache_dtype(const std::string& name);

struct RunnerOptions {
  int64_t max_tokens = 4096;          // the largest step (tokens); sizes the workspace
  // > 0: the memory plan may lower max_tokens down to this so that the workspace fits its budget
  // (and beside the weights and the smallest KV pool); options().max_tokens is then the plan's.
  // 0: max_tokens is what the caller needs (serve's chunked prefill, generate's prompt): refused
  // when it does not fit.
  int64_t min_tokens = 0;
  int64_t max_logits_rows = 0;        // > 0: logits rows per step at most (raised to max_requests and the
                                      // graph cap); 0: max_tokens (every token's)
  double workspace_fraction = 0.10;   // the workspace's budget: this share of the device
  // > 0: the indexer's score rows per chunk at most (tests / `generate --indexer-score-rows`);
  // 0: the plan's (a quarter of the workspace budget over max_context x 4 B, at least a row per
  // request and graph bucket). A step of more tokens scores and selects its rows in chunks.
  int64_t max_score_rows = 0;
  std::string tokens_flag = "--max-tokens";  // what sets max_tokens, for the plan's refusal
  // The KV the caller's work needs at once (engine::KvNeed: tokens, what for). The plan keeps the
  // largest it can, lowering max_tokens (down to min_tokens) to leave the pool that much before the
  // workspace grows; empty: one request at max_context (always kept). See runner_memory_plan.hpp.
  std::vector<KvNeed> kv_needs;
  std::string kv_flag = "--context-length";  // what sets the KV needs, for the plan's refusal
  int64_t max_requests = 256;         // the most requests in one step
  int64_t max_context = 8192;         // the longest request (positions); sizes the indexer scores
  int64_t page_size = 64;             // KV page size (a power of two)
  // The KV cache's elements (`--kv-cache-dtype`): BF16, or FP8_E4M3 for every array (latent 512,
  // rope 64, index keys 128: what cuda/attention's FP8 decode kernels and the CPU model's
  // `--kv-dtype fp8` keep), code = e4m3(x / scale), value = code * scale. The scales: these when
  // > 0 (positive and finite, else the load fails with one line); 0 = the default, 1.0 each
  // (SGLang's and vLLM's k_scale when a checkpoint gives none: the latent is RMS-normed and the
  // keys LayerNormed, |x| well inside E4M3's ±448), with a one-line warning. Other elements
  // (F32) are refused.
  KvElem kv_elem = KvElem::BF16;
  float kv_ckv_scale = 0.0f, kv_kpe_scale = 0.0f, kv_index_scale = 0.0f;
  double mem_fraction_static = 0.88;  // weights + workspace + KV pool share of the device
  int64_t max_total_tokens = 0;       // > 0: the KV pool holds at most this many tokens
  int64_t cuda_graph_max_bs = -1;     // decode graphs for batch buckets up to this; -1: max_requests, 0: none
  bool quiet = false;                 // no progress bar / plan lines (tests)
  bool poison = false;                // tests: every activation buffer NaN-filled before each step
  bool count_experts = true;          // per-expert token counts of every MoE layer each step (one
                                      // one-CTA kernel per MoE layer; StepOutput::expert_counts)
  int32_t max_decode_steps = 16;      // K of decode_greedy at most
  int32_t max_stop_ids = 16;          // stop ids per request in decode_greedy at most
  AttentionKernels attention_kernels = AttentionKernels::Auto;
  // Load the MTP layer (model.layers.{num_layers}: speculative decoding's draft): its weights and
  // its KV layer (the pool's layer num_layers, on the engine's pages) are in the memory plan and
  // the start-up lines; mtp_step runs it. A checkpoint without one is refused (one line).
  bool mtp = false;
  // With mtp: true quantizes the MTP layer's BF16 routed experts (NVIDIA's NVFP4 checkpoints
  // keep the layer unquantized) to NVFP4 on the host at load (model::quantize_mtp_experts), so
  // that they take the FP4 grouped GEMM (the commands' `--speculative-draft-model-quantization
  // nvfp4`, their default with speculation); false keeps them as stored: BF16 runs the
  // dense-over-experts fallback, refused with one line where its scratch does not fit the step.
  // Drafts only: the output is the target's.
  bool quantize_mtp_experts = false;
  // Benchmarks only (`bench step --replicate-layers`): > the checkpoint's layer count runs this
  // many layers, the checkpoint's own followed by copies of its MoE layers in turn, each copy its
  // own device memory (so a 3 dense + 2 MoE checkpoint times as 3 dense + 10 MoE layers).
  int64_t replicate_layers = 0;
};

// One step's host-side description: tokens [T], the batch (core/paged_kv.hpp, host pointers),
// and which flat rows want next-token outputs.
struct StepInput {
  const int32_t* tokens = nullptr;
  KvBatchView batch;
  std::vector<int32_t> logits_rows;
  // Device sampling of the LAST sampling.size() logits rows (row i of it samples logits row
  // logits_rows.size() - sampling.size() + i), results in StepOutput::sampled; at most
  // options().max_requests rows. Empty: none.
  std::vector<RowSampling> sampling;
  // Constrained decoding: per logits row, its vocabulary bitmask (SampleSpec::allowed_tokens:
  // bit v % 32 of word v / 32, ⌈vocab/32⌉ words, read during the call) or null; empty: none.
  // Uploaded in one copy and applied on the device (-inf) before the greedy argmax and the device
  // sampler, inside the decode graphs too; at most options().max_requests masked rows. The
  // logits StepOutput::logits returns are the masked ones.
  std::vector<const uint32_t*> token_masks;
  // Set (with token_masks): the masks are still being filled on a host thread. The step then
  // enqueues its forward unmasked, calls this (it blocks until they are complete) while the
  // device runs it, uploads them and masks + argmaxes the logits rows again before the outputs.
  std::function<void()> await_token_masks;
};

// The discrete choices of one step, per layer (tests: imposed on the CPU backend through
// model::StepChoiceHooks so that near-ties broken differently by BF16 rounding choose alike):
// MoE layers' router logits [T, E] and chosen expert ids [T, top_k]; indexer layers' top-k
// positions [T, index_topk] (ascending, -1 padded). Empty for the other layers.
struct StepChoices {
  std::vector<std::vector<float>> router_logits;
  std::vector<std::vector<int32_t>> expert_ids, topk_positions;
};

// Device time of one step by stage (StepOutput::stages: an eager pass with cudaEvents between
// the stages). Attention includes the norms, MLA projections, RoPE, cache append, the absorbed
// attention and o_proj with its residual add; indexer = the DSA indexer's key, query, weights,
// scores and top-k; moe = the MoE layers' router, experts, shared expert and residual adds;
// dense = dense layers' MLP; lm_head = final norm, row gather and lm_head; sampling = argmax
// (device sampling through StepInput::sampling runs after the timed forward: in device_ms only).
enum class StepStage : int { Embed, Attention, Indexer, Moe, Dense, LmHead, Sampling };
inline constexpr int kNumStepStages = 7;
const char* step_stage_name(StepStage s);  // "embed", "attention", "indexer", "moe", "dense", "lm_head", "sampling"
struct StageTimes {
  double ms[kNumStepStages] = {};
  double total() const;
};

struct StepOutput {
  std::vector<float>* logits = nullptr;    // [rows, vocab] FP32 when set
  std::vector<int32_t>* greedy = nullptr;  // [rows] argmax when set
  model::HiddenStates* hidden = nullptr;   // per-layer hidden states when set (forces eager)
  StepChoices* choices = nullptr;          // the step's routing / top-k when set (forces eager)
  // [num_moe_layers(), num_experts] tokens routed to each routed expert by each MoE layer (in
  // moe_layer_ids() order), real tokens only (a graph bucket's padding rows are not counted);
  // copied back with the other outputs (graph replay or eager). Needs options().count_experts.
  std::vector<int32_t>* expert_counts = nullptr;
  StageTimes* stages = nullptr;            // per-stage device time when set (forces eager)
  double* device_ms = nullptr;             // device time from the metadata upload to the results (cudaEvents)
  // [sampling rows] the device-sampled tokens of StepInput::sampling (logprob / top filled for
  // rows with logprobs_top_n >= 0); required with it. `logits` (when set) are read before the
  // sampler applies penalties in place.
  std::vector<GeneratedToken>* sampled = nullptr;
  // [T, hidden] every real token's state after the final norm (the BF16 activation as FP32; the
  // MTP layer's input), graph replay or eager, when set.
  std::vector<float>* final_hidden = nullptr;
};

// One MTP step (GpuRunner::mtp_step, model::Model::mtp_step's contract): flat token t at
// position p = batch.positions[t] is the token after p, h_in[t] the target's state at p after
// its final norm (host FP32 [T, hidden], rounded to BF16 on the device); the MTP layer writes its
// KV (pool layer num_layers) at p and returns the logits of logits_rows and/or its own output
// states (after shared_head.norm).
struct MtpStepInput {
  const int32_t* tokens = nullptr;
  const float* h_in = nullptr;
  KvBatchView batch;
  std::vector<int32_t> logits_rows;
};
struct MtpStepOutput {
  std::vector<float>* logits = nullptr;  // [rows, vocab] when set
  std::vector<float>* hidden = nullptr;  // [T, hidden] when set
};

// K greedy decode steps in one call (decode_greedy): every request has one token (its last
// one) at position p = kv_len - 1; its page table covers the positions the launch may write,
// p .. p + min(steps, max_new) - 1. The token of step j is the input of step j + 1; request r
// stops after max_new[r] tokens or after one of its stop ids (included in its output).
struct DecodeInput {
  const int32_t* tokens = nullptr;  // [B] last token per request
  KvBatchView batch;                // the first step: one token per request
  int32_t steps = 1;                // K, 1 .. options().max_decode_steps
  const int32_t* max_new = nullptr; // [B] >= 1 (null: K each)
  std::vector<std::vector<int32_t>> stop_ids;  // per request (or empty: none), <= options().max_stop_ids each
  // decode_sampled: per request its device sampling (draw_index = tokens it generated before the
  // launch; it advances by one per token on the device, and penalised rows' histories grow).
  std::vector<RowSampling> sampling;
};

// One greedy speculative round on the device (spec_round_greedy): model/speculative.hpp's
// GreedyRoundInput / GreedyRoundOutput (device_ms: cudaEvents around the round's launches).
using GreedyRoundInput = model::GreedyRoundInput;
using GreedyRoundOutput = model::GreedyRoundOutput;

struct RunnerStats {
  int64_t graph_steps = 0, eager_steps = 0;
  double graph_capture_seconds = 0.0;
  int64_t graph_bytes = 0;
};

class GpuRunner {
 public:
  static std::unique_ptr<GpuRunner> load(const std::string& dir, const RunnerOptions& opt);
  ~GpuRunner();
  GpuRunner(const GpuRunner&) = delete;
  GpuRunner& operator=(const GpuRunner&) = delete;

  const model::MlaModelConfig& config() const;
  const std::string& description() const;  // the one start-up line: model, weights, load GB/s
  const std::string& plan_line() const;    // the memory plan line
  const std::string& graph_line() const;   // graph buckets, capture time, memory ("" without graphs)
  // Which attention kernels each layer's steps take (one line, printed at load).
  const std::string& attention_line() const;
  // True when the fast attention kernels (MlaDecodeMma) serve this model's decode / top-k rows.
  bool fast_attention() const;
  const RunnerOptions& options() const;
  const RunnerStats& stats() const;

  // The KV pool: pages [0, num_pages()) of page_size() tokens.
  int64_t num_pages() const;
  int64_t page_size() const;
  int64_t kv_bytes_per_token() const;
  int64_t weight_bytes() const;
  int64_t workspace_bytes() const;
  int64_t max_logits_rows() const;  // logits rows one step may ask for
  std::vector<int32_t> alloc_pages(int64_t n);  // throws when fewer are free
  void release_pages(const std::vector<int32_t>& pages);
  int64_t free_pages() const;
  // The KV pool's device bytes (every page, the padding page included), for benchmarks: `bench
  // step` fills them with random keys, since the zeroed pool ties every indexer score and sends
  // every long row's top-k down its tie path (a cost real caches do not see).
  void* kv_pool_data() const;
  size_t kv_pool_bytes() const;

  // One forward step. Decode-only batches (one token per request, every row asked for)
  // within cuda_graph_max_bs replay a graph unless `out.hidden` is set or graphs are off.
  // Throws fp4moe::Error (one line) on a bad batch before launching anything.
  void step(const StepInput& in, const StepOutput& out);
  // K decode steps back to back on the device (the decode graph of the bucket replayed K times,
  // or eager above the graph cap / with graphs off), a small kernel between steps (greedy token
  // → next input, positions, stop ids, max_new), results read back once. tokens_out [K × B]
  // step-major, -1 after a request finished; produced [B] 1 .. K; expert_counts [K ×
  // num_moe_layers() × num_experts] (a finished request's steps not counted); last_logits
  // [B, vocab] of step K-1 (a finished request's row is its dummy's). Throws (one line) on a
  // bad input before launching anything.
  void decode_greedy(const DecodeInput& in, std::vector<int32_t>& tokens_out, std::vector<int32_t>& produced,
                     std::vector<int32_t>* expert_counts = nullptr, std::vector<float>* last_logits = nullptr);
  // decode_greedy with cuda/sampling's sample() instead of the argmax (in.sampling: one row per
  // request): a request's tokens depend on its own row only (seed, draw index), so they are the
  // same for any K, alone or batched, graph or eager. details [K x B] step-major (when set): the
  // token with its logprob / top logprobs for rows that asked (id -1 where tokens_out is -1).
  // last_logits: a penalised row's are after its penalties (applied in place).
  void decode_sampled(const DecodeInput& in, std::vector<int32_t>& tokens_out, std::vector<int32_t>& produced,
                      std::vector<GeneratedToken>* details = nullptr, std::vector<int32_t>* expert_counts = nullptr,
                      std::vector<float>* last_logits = nullptr);

  // The MTP layer (RunnerOptions::mtp): eager, one metadata upload, results read back once.
  // Throws (one line) on a bad batch or without the layer, before launching anything.
  bool has_mtp() const;
  void mtp_step(const MtpStepInput& in, const MtpStepOutput& out);
  // The weight bytes one MTP step reads (its layer's, and lm_head's when it has no head of its
  // own; all its routed experts counted) and its KV bytes per token; 0 without the layer.
  int64_t mtp_weight_bytes() const;
  int64_t mtp_kv_bytes_per_token() const;
  // What one step of the target model touches at most: weight_bytes() and kv_bytes_per_token()
  // less the MTP layer's own (which count it when it is loaded).
  int64_t target_weight_bytes() const;
  int64_t target_kv_bytes_per_token() const;

  // A greedy speculative round in one launch sequence (gpu_spec_round.cpp): N - 1 chained MTP
  // draft steps (argmax on the device, each draft fed to the next step there; each step replays
  // the MTP graph of its batch bucket), the verify step over the R·(n + 1) rows as one decode
  // step (the decode graph of its bucket), the acceptance kernel (core/spec_accept.hpp: the
  // longest prefix where draft k equals the target's argmax of row k - 1, plus the bonus, cut by
  // stop ids / max_new with the K-step decode's rule), the MTP catch-up over every verify row
  // (rows past a request's emitted ones are computed and ignored: their MTP cache writes lie past
  // its length and are rewritten before anything reads them), then ONE readback. Throws (one line)
  // on a bad input before launching anything.
  void spec_round_greedy(const GreedyRoundInput& in, GreedyRoundOutput& out);

  // The MoE layers (those StepOutput::expert_counts reports, in this order) and their experts.
  int64_t num_moe_layers() const;
  std::vector<int32_t> moe_layer_ids() const;
  int64_t num_experts() const;  // routed experts per MoE layer (config().moe.num_experts)
  // Device bytes of one routed expert (gate_up + down with scales) of an FP4 MoE layer; 0 where
  // the routed experts are BF16 (benchmarks: the bytes a step touches).
  int64_t routed_expert_bytes() const;

  // Forces eager execution (tests compare graph replay with eager).
  void set_graphs_enabled(bool on);

  struct Impl;

 private:
  GpuRunner();
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::engine::gpu
