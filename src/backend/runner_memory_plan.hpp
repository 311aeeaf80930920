// The CUDA runner's start-up memory plan: its step workspace buffer by buffer, the tokens per step
// that fit the workspace budget, and the KV pool from what is left of --mem-fraction-static of the
// device (the engine's plan_memory takes that pool as is: BackendInfo::kv_pool_tokens). Plain host
// arithmetic in fp4moe_backend, so it builds and is tested without CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"

namespace fp4moe::engine {

// ---------------------------------------------------------------------------------------------
// The GPU runner's plan (backend/cuda/gpu_runner.cpp calls it before it allocates anything on the
// device, and again after the weights are up, with the measured sizes). Pure arithmetic: tested
// on the CPU (tests/engine/memory_plan_test.cpp, RunnerMemoryPlan.*) for GLM-5's dimensions.
//
// The per-step workspace grows with the tokens per step T (activations, the MoE scratch) and with
// T x max_context (the indexer's FP32 score rows); the logits with the logits rows. The plan
// keeps it within `workspace_fraction` of the device: where the tokens per step may shrink
// (min_tokens > 0) it takes the largest T in [min_tokens, max_tokens] that fits, else it refuses.
// Then weights + workspace + graphs (estimate) + the KV the caller needs (kv_needs: at least one
// request at the full context) must fit mem_fraction_static x device minus what is already in
// use. The KV comes before the workspace: where T may shrink, the plan lowers it (down to
// min_tokens) until the pool holds the largest need it can; a need that no T in [min_tokens,
// max_tokens] leaves room for is passed over (RunnerPlan::kv_needs_unmet) for the next smaller
// one, down to the smallest pool (one request at the full context); when not even that fits it
// refuses, one line naming the part, the bytes and the flag to change.

// What the workspace depends on (model::MlaModelConfig; per GPU where sharded).
struct RunnerDims {
  int64_t hidden = 0, heads = 0, qk_head_dim = 0, kv_lora = 0, rope = 0, v_head = 0, q_lora = 0;
  int64_t index_heads = 0, index_dim = 0, index_topk = 0;
  bool indexer = false;      // some layer computes DSA scores
  bool fp8_index_queries = false;  // FP8 index keys scored by cuda/indexer's mma kernel: the queries
                                   // quantized to E4M3 [T, HI, D] + their folded weights [T, HI] FP32
  int64_t vocab = 0;
  int64_t max_inter = 0;     // the widest dense MLP (dense layers, a shared expert run as one)
  // FP4 MoE layers (MoeLayerCuda): rows per token in the routed GEMMs (top_k + folded shared experts)
  bool moe = false;
  int64_t experts = 0, top_k = 0, moe_inter = 0, moe_rows_per_token = 0;
  // BF16 routed experts run dense over all experts (the fallback's [E, T, ...] scratch)
  bool dense_experts = false;
  // The fast attention's rope queries [T, heads, rope] BF16 (with MlaDecodeMma; else a 1-byte stub).
  bool rope_queries = true;
  int64_t kv_bytes_per_token = 0;  // every layer's latent + rope (+ index key): runner_kv_bytes_per_token
};

// KV tokens a caller's work needs the pool to hold at once (bench step: a decode point's batch x
// its pages; serve: one request of --context-length; generate: the prompt + its new tokens), and
// what they are for, in the start-up line and the refusal ("B 8 x 32768 ctx decode").
struct KvNeed {
  int64_t tokens = 0;
  std::string what;
};

// The fewest tokens per step a caller that lets the plan lower them takes for its prefill (bench
// step: RunnerPlanInput::min_tokens is this or its largest decode batch's rows, the larger; at
// most what it asked): below it chunked prefill costs more than the KV it frees is worth.
inline constexpr int64_t kMinPrefillTokensPerStep = 1024;

// The pool tokens `batch` requests of `tokens` positions each take, in whole pages of page_size
// (bench step's decode points: a KvNeed each).
int64_t kv_tokens_for_batch(int64_t batch, int64_t tokens, int64_t page_size);

struct RunnerPlanInput {
  RunnerDims dims;
  int64_t device_bytes = 0;     // the device's memory
  int64_t in_use_bytes = 0;     // already taken before the plan's parts (CUDA context, other processes;
                                // after the load: weights and attention workspaces too)
  int64_t weight_bytes = 0;     // weights still to upload (0 after the load: they are in in_use_bytes)
  double mem_fraction_static = 0.88;
  double workspace_fraction = 0.10;  // the workspace budget: this share of the device
  int64_t max_tokens = 4096;    // tokens per step asked
  int64_t min_tokens = 0;       // > 0: the plan may lower max_tokens down to this to fit the budget
  int64_t max_logits_rows = 0;  // 0: max_tokens
  int64_t max_requests = 1;
  int64_t max_context = 8192;
  int64_t max_decode_steps = 16;
  int64_t page_size = 64;
  int64_t max_total_tokens = 0;  // > 0: the KV pool's cap
  int64_t graph_buckets = 0;     // decode graphs to capture
  int64_t fixed_workspace_bytes = 0;  // size-independent scratch (the FP4 linears' GEMM workspace)
  // The indexer's score rows [rows, max_context] FP32 run in chunks of rows: the rows take at most
  // indexer_share of the workspace budget, at least min_score_rows (a decode step's: never
  // chunked), at most max_score_rows when > 0, at most the tokens per step.
  double indexer_share = 0.25;
  int64_t min_score_rows = 1;
  int64_t max_score_rows = 0;
  // Device-side sizes (the runner passes cuda/'s functions; null: the estimates in runner_memory_plan.cpp)
  std::function<int64_t(int64_t tokens)> moe_workspace;    // MoeLayerCuda::workspace_bytes(T)
  std::function<int64_t(int64_t tokens)> router_workspace;  // the BF16-experts router's
  std::function<int64_t(int64_t rows, int64_t ctx)> topk_workspace;  // cuda::indexer::top_k_workspace_bytes
  std::function<int64_t(int64_t rows)> sample_workspace;   // cuda::sampling::sample_workspace_bytes
  std::function<int64_t(int64_t rows)> sample_in_bytes;    // GpuRunner::Impl::sample_in_bytes
  std::function<int64_t(int64_t steps, int64_t rows)> sample_out_bytes;  // 4 x GpuRunner::Impl::sample_out_ints
  std::function<int64_t(int64_t logits_rows, int64_t rows)> token_mask_bytes;  // GpuRunner::Impl::token_mask_bytes
  // What sets the tokens per step, for the refusal ("--chunked-prefill-size", "the prompt", ...).
  std::string tokens_flag = "--chunked-prefill-size";
  // The KV the caller needs, in any order (each rounded up to pages + the padding page, capped by
  // max_total_tokens). The plan keeps the largest one it can (see above); the smallest pool, one
  // request at max_context, is always the last to try (needs below it are that one).
  std::vector<KvNeed> kv_needs;
  // What sets the KV needs, for the refusal ("--context-length", "--ctx / --batch", ...).
  std::string kv_flag = "--context-length";
};

// The workspace's parts at T tokens per step (bytes, each buffer 256-aligned as laid out).
struct RunnerWorkspace {
  int64_t activations = 0;  // [T, ...] per-layer buffers (residual, norms, MLA, MLP)
  int64_t indexer = 0;      // scores [score rows, max_context] FP32 + top-k rows [T] + the long rows' top-k scratch
  int64_t moe = 0;          // the MoE scratch shared by every layer (+ the BF16-experts fallback's)
  int64_t logits = 0;       // [logits rows, vocab] FP32 + the gathered rows
  int64_t sampling = 0;     // device sampling of max_requests rows + penalty histories
  int64_t fixed = 0;
  int64_t total() const { return activations + indexer + moe + logits + sampling + fixed; }
};
RunnerWorkspace runner_workspace(const RunnerPlanInput& in, int64_t tokens, int64_t logits_rows);

// The step workspace buffer by buffer: GpuRunner::Impl's Scratch pointers, one each.
enum class WsBuf : uint8_t {
  X, H, O, Of, Qa, Q, Kva, Ckv, Ql, Ol, Qpe, Ov, Ik, Iq, Iw16, Iw, Iq8, Iw8,  // activations (Iq8, Iw8: indexer)
  Scores, ChunkQo, TopkPos, TopkSlot,                                       // indexer
  G, U, Hm,                                                                 // activations (MLPs)
  Rows, Logits, Greedy, ArgmaxWs,                                           // logits
  Rlogits, Rids, Rw, Gu, Eh, Ey, MoeWs, RouterWs,                           // MoE (+ the BF16-experts fallback)
  TopkWs, Fp4Ws,                                                            // indexer, fixed
  SampleWs, SampleIn, SampleOut, SampleHist, TokenMasks,                    // sampling
  Count
};
struct WsBuffer {
  WsBuf id;
  int64_t bytes;  // as asked (the layout gives each max(bytes, 1) rounded up to 256)
};
// The step workspace at `tokens` tokens per step and `logits_rows` logits rows, in layout order:
// GpuRunner::Impl::plan_memory lays the buffers out in this order and runner_workspace sums them
// by part, so the plan and the allocation are one list. The FP8 index queries (Iq8, Iw8) are
// listed only with dims.fp8_index_queries.
std::vector<WsBuffer> runner_workspace_buffers(const RunnerPlanInput& in, int64_t tokens, int64_t logits_rows);
// A buffer's bytes in the layout: max(bytes, 1) rounded up to 256.
int64_t ws_layout_bytes(int64_t bytes);
// The score rows per chunk at `tokens` tokens per step (= tokens where the indexer is absent).
int64_t runner_score_rows(const RunnerPlanInput& in, int64_t tokens);

struct RunnerPlan {
  bool ok = false;
  std::string error;            // one line when refused
  int64_t max_tokens = 0;       // tokens per step planned
  bool tokens_lowered = false;  // below what was asked (to fit the budget)
  int64_t tokens_asked = 0;
  int64_t logits_rows = 0;
  int64_t score_rows = 0;       // the indexer's rows per chunk
  RunnerWorkspace ws;
  int64_t workspace_budget = 0;
  int64_t graph_bytes = 0;      // estimate
  int64_t min_kv_tokens = 0, min_kv_bytes = 0;  // one request at the full context + the padding page
  int64_t kv_budget_bytes = 0;  // what the KV pool may take
  int64_t kv_tokens = 0;        // tokens the pool would hold (before paging)
  // The KV need planned for (the largest that fits): its pool tokens (pages + the padding page,
  // at least min_kv_tokens), what it is for, and whether T was lowered below what fits the
  // workspace budget alone to leave the pool that much ("to leave the KV pool N tokens for ...").
  int64_t kv_need_tokens = 0;
  std::string kv_need_what;
  bool lowered_for_kv = false;
  std::vector<std::string> kv_needs_unmet;  // the larger needs no tokens per step left room for ("what (N tokens)")
  std::string describe() const;  // the pieces, one line
};

// Graph memory estimate per captured decode bucket (measured graphs are reported after capture).
inline constexpr int64_t kGraphBytesPerBucket = int64_t(16) << 20;

RunnerPlan plan_runner_memory(const RunnerPlanInput& in);

// The runner's KV bytes per token over all layers: latent (kv_lora) + rope of `elem` in each of
// `layers`, the index key (index_dim) of `index_elem` in the `indexer_layers` that keep one
// (core/paged_kv.hpp's arrays; kv_elem_size: BF16 2 B, FP8 E4M3 1 B).
int64_t runner_kv_bytes_per_token(int64_t layers, int64_t indexer_layers, int64_t kv_lora, int64_t rope,
                                  int64_t index_dim, KvElem elem, KvElem index_elem);

}  // namespace fp4moe::engine
