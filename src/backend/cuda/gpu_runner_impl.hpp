// GpuRunner's internals (src/backend/cuda only): device weights per layer, the step workspace
// layout, the per-step metadata buffers, graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"
#include "cuda/attention/mla.hpp"
#include "cuda/attention/mla_decode.hpp"
#include "cuda/attention/mla_warp_bf16.hpp"
#include "cuda/attention/mla_warp_fp8.hpp"
#include "cuda/common/device_batch.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/elementwise/elementwise.hpp"
#include "cuda/embed/embed.hpp"
#include "cuda/indexer/indexer_score_warp_bf16.hpp"
#include "cuda/indexer/indexer_score_warp_fp8.hpp"
#include "cuda/linear/linear.hpp"
#include "cuda/norm/norm.hpp"
#include "cuda/permute/dense_combine_f32.hpp"
#include "cuda/rope/rope.hpp"
#include "cuda/routing/router.hpp"
#include "cuda/sampling/argmax_f32.hpp"
#include "cuda/sampling/sampling.hpp"
#include "cuda/sampling/token_bitmask_f32.hpp"
#include "cuda/step/step.hpp"
#include "backend/cuda/gpu_loader.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/runner_memory_plan.hpp"
#include "engine/page_pool.hpp"
#include "format/checkpoint.hpp"
#include "model/weights.hpp"
#include "moe/moe_layer_cuda.hpp"
#include "tuner/attention_plan.hpp"

namespace fp4moe::engine::gpu {

// The runner's kernels (src/cuda families), called unqualified in cuda_ops / gpu_decode.
using cuda::DeviceBatch;
using cuda::moe_dense_combine_f32;
using cuda::attention::kv_append_bf16;
using cuda::attention::kv_append_fp8;
using cuda::attention::mla_attention_warp_fp8;
using cuda::attention::mla_attention_warp_bf16;
using cuda::elementwise::add_into;
using cuda::elementwise::bf16_to_f32_scaled;
using cuda::elementwise::f32_to_bf16;
using cuda::elementwise::silu_mul;
using cuda::embed::embed_rows;
using cuda::embed::gather_rows;
using cuda::indexer::indexer_scores_warp_bf16;
using cuda::indexer::indexer_scores_warp_fp8;
using cuda::linear::Blas;
using cuda::linear::Linear;
using cuda::linear::LinearCtx;
using cuda::linear::linear_to_bf16;
using cuda::norm::layer_norm;
using cuda::norm::rms_norm;
using cuda::rope::rope;
using cuda::sampling::apply_token_bitmask_f32;
using cuda::sampling::argmax_rows_f32;
using cuda::step::chunk_qo_indptr;
using cuda::step::count_experts;
using cuda::step::greedy_advance;
using cuda::step::GreedyAdvanceArgs;

struct DeviceNorm {
  cuda::DeviceBuffer w, b;  // FP32 [dim]; b only for LayerNorm
  const float* wp() const { return w.as<float>(); }
  const float* bp() const { return b.as<float>(); }
};

struct DenseMlp {
  Linear gate, up, down;
  int64_t inter = 0;
};

// BF16 routed experts: every expert on every token (cuBLAS strided batched), routed combine.
struct DenseExperts {
  cuda::DeviceBuffer w13;  // [E, 2I, H] BF16: per expert gate rows then up rows
  cuda::DeviceBuffer w2;   // [E, H, I] BF16
  cuda::DeviceBuffer router_w, router_bias;  // FP32 [E, H], [E] (or empty)
  cuda::RouterDesc router;
};

struct DeviceLayer {
  DeviceNorm input_norm, post_norm;
  // attention
  Linear q_proj, q_a, q_b, kv_a, kv_b, o;
  DeviceNorm q_a_norm, kv_a_norm;
  bool has_indexer = false;
  Linear wq_b, wk, weights_proj;
  DeviceNorm k_norm;
  // MLP / MoE
  bool is_moe = false;
  DenseMlp mlp;                                // dense layers
  std::unique_ptr<MoeLayerCuda> moe;           // FP4 routed experts (+ FP4 shared expert)
  std::optional<DenseExperts> dense_experts;   // BF16 routed experts
  std::optional<DenseMlp> shared;              // a shared expert run as a dense MLP
};

// The MTP layer (model.layers.{num_layers}; RunnerOptions::mtp): x = eh_proj([enorm(embed(t)) |
// hnorm(h)]), its decoder block (KV layer num_layers of the pool), shared_head.norm, its head.
struct DeviceMtp {
  DeviceNorm enorm, hnorm, head_norm;
  Linear eh_proj;                 // [hidden, 2·hidden], FP32 out into the residual
  cuda::DeviceBuffer embed;          // its own embedding [vocab, H] BF16, or empty: the model's
  std::optional<Linear> head;     // its own head, or none: lm_head
  DeviceLayer block;
  model::IndexerKind indexer = model::IndexerKind::None;  // its own ("full") or none
  int64_t bytes = 0;                 // device bytes of its weights
};

// Byte offsets of the step workspace's buffers (for max_tokens tokens).
struct Scratch {
  float* x = nullptr;          // [T, H] residual (FP32)
  uint16_t* h = nullptr;       // [T, H] normed input (BF16)
  uint16_t* o = nullptr;       // [T, H] block output (BF16)
  float* of = nullptr;         // [T, H] MoE output (FP32)
  uint16_t* qa = nullptr;      // [T, q_lora]
  uint16_t* q = nullptr;       // [T, NH, QK]
  uint16_t* kva = nullptr;     // [T, C + R]
  uint16_t* ckv = nullptr;     // [T, C]
  uint16_t* ql = nullptr;      // [T, NH, C] absorbed query
  uint16_t* ol = nullptr;      // [T, NH, C] latent output
  uint16_t* qpe = nullptr;     // [T, NH, R] rope query, contiguous (the fast attention path's)
  uint16_t* ov = nullptr;      // [T, NH, V]
  uint16_t* ik = nullptr;      // [T, D]
  uint16_t* iq = nullptr;      // [T, HI, D]
  uint16_t* iw16 = nullptr;    // [T, HI]
  float* iw = nullptr;         // [T, HI]
  uint8_t* iq8 = nullptr;      // FP8 cache with the mma indexer: [T, HI, D] E4M3 (quantize_q_fp8)
  float* iw8 = nullptr;        // FP8 cache with the mma indexer: [T, HI] the folded head weights
  float* scores = nullptr;     // [score_rows, max_context] (a step's rows in chunks of score_rows)
  int32_t* chunk_qo = nullptr;  // [max_requests + 2] a chunk's request boundaries (chunk_qo_indptr)
  int32_t* topk_pos = nullptr;   // [T, index_topk]
  int32_t* topk_slot = nullptr;  // [T, index_topk]
  uint16_t* g = nullptr;       // [T, max(I_dense, shared I)] (dense: gate out; then SiLU·up)
  uint16_t* u = nullptr;       // [T, max I]
  uint16_t* hm = nullptr;      // [T, max I]
  uint16_t* rows = nullptr;    // [T, H] gathered final rows
  float* logits = nullptr;     // [T, vocab]
  int32_t* greedy = nullptr;   // [T]
  void* argmax_ws = nullptr;   // the greedy argmax's split form (zeroed once; each launch leaves it so)
  size_t argmax_ws_bytes = 0;
  // BF16-experts fallback
  float* rlogits = nullptr;    // [T, E]
  int32_t* rids = nullptr;     // [T, k]
  float* rw = nullptr;         // [T, k]
  uint16_t* gu = nullptr;      // [E, T, 2I]
  uint16_t* eh = nullptr;      // [E, T, I]
  float* ey = nullptr;         // [E, T, H]
  void* moe_ws = nullptr;      // MoeLayerCuda workspace (zeroed once)
  size_t moe_ws_bytes = 0;
  void* router_ws = nullptr;   // the fallback router's (zeroed once)
  size_t router_ws_bytes = 0;
  void* topk_ws = nullptr;     // the indexer top-k's, rows longer than 16K keys (zeroed once)
  size_t topk_ws_bytes = 0;
  void* fp4_ws = nullptr;      // FP4 linears' GEMM workspace
  // Device sampling (gpu_sample.cpp) for up to S = max_requests rows and K = max_decode_steps:
  void* sample_ws = nullptr;   // cuda::sampling::sample's, S rows
  size_t sample_ws_bytes = 0;
  uint8_t* sample_in = nullptr;    // one upload of n rows: params [n] then prompt_len, output_len, draw, done [n]
  int32_t* sample_out = nullptr;   // tokens [K·S], logprob [K·S], top ids [K·S·20], top logprobs [K·S·20]
  int32_t* sample_hist = nullptr;  // [S · (max_context + K)] penalty token lists (stride per upload)
  // Grammar masks (gpu_sample.cpp): int32 slots [logits_rows] (-1: the row is unconstrained), then
  // uint32 masks [S, ⌈vocab/32⌉] packed in slot order; fixed address, read by the decode graphs.
  uint8_t* token_masks = nullptr;
};

// Per-step metadata: fixed device buffers filled by one H2D copy from a pinned mirror.
struct StepMeta {
  int64_t max_tokens = 0, max_requests = 0, max_page_entries = 0;
  int32_t *tokens = nullptr, *positions = nullptr, *token_req = nullptr, *qo_indptr = nullptr, *kv_len = nullptr,
          *page_indptr = nullptr, *page_indices = nullptr, *rows = nullptr, *offsets = nullptr,
          *active = nullptr;  // [max_requests] 1 for a real running request, 0 for padding / finished
  size_t ints = 0;  // total int32 count of the block
};

// Pinned host int32 array (the targets of the step's device → host copies).
struct PinnedInts {
  int32_t* p = nullptr;
  size_t n = 0;
  void alloc(size_t count);
  PinnedInts() = default;
  PinnedInts(const PinnedInts&) = delete;
  PinnedInts& operator=(const PinnedInts&) = delete;
  ~PinnedInts();
};

// Per-expert counts and the K-step decode block (fixed device addresses: graphs write counts).
struct StepCounters {
  int64_t moe_layers = 0, experts = 0;
  std::vector<int32_t> moe_ids;        // layer index of each MoE layer
  std::vector<int32_t> moe_slot;       // per layer: its MoE ordinal or -1
  cuda::DeviceBuffer counts;           // [moe_layers, E] this step's
  cuda::DeviceBuffer step_counts;      // [max_decode_steps, moe_layers, E] of a K-step launch
  PinnedInts counts_host;              // [max_decode_steps, moe_layers, E]
  // decode block (device + pinned mirror): max_new [Rm], stop ids [Rm, S], produced [Rm], out [Kmax, Rm]
  cuda::DeviceBuffer dec;
  PinnedInts dec_host;
  int64_t rm = 0, stops = 0, kmax = 0;
  int32_t* max_new() const { return dec.as<int32_t>(); }
  int32_t* stop_ids() const { return max_new() + rm; }
  int32_t* produced() const { return stop_ids() + rm * stops; }
  int32_t* out() const { return produced() + rm; }
  size_t in_ints() const { return size_t(rm * (stops + 2)); }  // max_new, stop ids, produced
};

// cudaEvents between the stages of an eager forward (StepOutput::stages).
struct StageMarks {
  std::vector<cudaEvent_t> events;
  std::vector<StepStage> stage;  // stage[i]: what ran from events[i] to events[i + 1]
  size_t used = 0;
  ~StageMarks();
};

// One upload of sampling rows (GpuRunner::Impl::upload_sampling): sample()'s arguments but the
// logits and outputs, and the device arrays the K-step advance updates.
struct SampleLaunch {
  cuda::sampling::SampleArgs args;
  int64_t n = 0;
  bool logprobs = false;         // some row wants logprobs
  int32_t *prompt_len = nullptr, *output_len = nullptr, *draw = nullptr, *done = nullptr;
  int64_t history_stride = 0;    // 0: no row has penalties (no history)
};

struct GraphEntry {
  cudaGraphExec_t exec = nullptr;
  int64_t bucket = 0;
};

struct GpuRunner::Impl {
  RunnerOptions opt;
  model::MlaModelConfig cfg;
  std::unique_ptr<Checkpoint> ck;
  std::string description, plan_line, graph_line, attention_line;
  std::string mtp_note;  // the MTP layer's experts quantized at load (the description's words), or empty
  RunnerStats stats;

  Blas blas;
  cudaStream_t stream = nullptr;
  cuda::DeviceBuffer embed;  // [vocab, H] BF16 (F32 checkpoints converted)
  std::vector<DeviceLayer> layers;
  DeviceNorm final_norm;
  Linear lm_head;
  std::unique_ptr<DeviceMtp> mtp;  // RunnerOptions::mtp: the MTP layer (its KV: kv_layers[num_layers])
  // The weights and KV layer of a decoder block: a target layer, or the MTP layer's.
  const DeviceLayer& layer(model::LayerRef r) const { return r.mtp ? mtp->block : layers[size_t(r.layer)]; }
  const KvLayerView& kv_layer(model::LayerRef r) const {
    return kv_layers[r.mtp ? size_t(cfg.num_layers) : size_t(r.layer)];
  }
  cuda::DeviceBuffer inv_freq;  // [R/2] FP32
  int64_t weight_bytes = 0;

  // Workspace + metadata + KV pool.
  cuda::DeviceBuffer workspace, meta_dev, kv;
  int32_t* meta_host = nullptr;  // pinned mirror of meta_dev
  Scratch s;
  StepMeta meta;
  int64_t workspace_bytes = 0;
  int64_t logits_rows = 0;  // s.logits / s.rows / s.greedy rows (the plan's)
  int64_t score_rows = 0;   // s.scores rows: the indexer scores / top-k of a step run in chunks of these
  RunnerPlanInput plan_in;  // the plan's input (from load)
  RunnerPlan plan;          // plan_runner_memory's: before the load (estimates), then with the measured sizes
  int64_t start_in_use = 0;  // device bytes in use before the runner allocated anything
  std::string phase = "starting";  // what the load is doing (an out-of-memory error names it)
  // The plan's input for this model and options (dims from cfg and the bound weights; device sizes
  // from cuda/'s host functions where they exist).
  // After a CUDA out-of-memory error (cuda::OutOfMemory) while `doing`: throws the plan's one
  // line instead (what ran out, the plan, what to change).
  [[noreturn]] void rethrow_out_of_memory(const std::string& doing) const;
  void run_step(const StepInput& in, const StepOutput& out);  // GpuRunner::step
  RunnerPlanInput plan_input(const model::ModelWeights& w, int64_t device_bytes) const;
  int64_t num_pages = 0, trash_page = 0, kv_per_token = 0;
  // The KV cache's element (opt.kv_elem: BF16 or FP8_E4M3 for every array) and its FP8 scales
  // (choose_kv_elem at load: the options' or the defaults, validated).
  bool kv_fp8 = false;
  float ckv_scale = 1.0f, kpe_scale = 1.0f, index_scale = 1.0f;
  std::string kv_line;  // the FP8 scales' source, for the plan line
  void choose_kv_elem();
  std::vector<KvLayerView> kv_layers;
  std::unique_ptr<PagePool> page_pool;  // the pool's page ids for alloc_pages (generate, bench step, tests)

  StepCounters counters;
  StageMarks* marks = nullptr;      // set during a timed eager forward
  std::unique_ptr<StageMarks> mark_pool;
  cudaEvent_t ev_begin = nullptr, ev_end = nullptr;

  // The fast attention kernels (null: the runner's own everywhere), as attention_plan says.
  std::unique_ptr<cuda::attention::MlaDecodeMma> mla_fast;
  std::unique_ptr<cuda::attention::MlaSm90> mla_fi_decode;  // Auto / FlashInferDecode where FlashInfer runs
  bool fast_indexer = false;  // cuda/indexer's mma scores (with mla_fast, 32 index heads x 128)
  bool fast_index_key = false;  // cuda/indexer's fused key LayerNorm + RoPE + cache write (with fast_indexer)
  bool fast_latent = false;  // cuda/attention's fused latent RMSNorm + RoPE + cache write (every key fused)
  // cuda/indexer's top-k settings and the one-token steps' sparse kernel: the attention plan's
  // (tuner/attention_plan.hpp, where the measurements behind them are written).
  static constexpr int kTopKOneCtaMinRows = tuner::kTopKOneCtaMinRows;
  static constexpr int kTopKSampleLines = tuner::kTopKSampleLines;
  int topk_one_cta_keys_many_rows = 0;  // rows up to this many keys on one CTA (32768 where shared memory allows)
  int topk_one_cta_max_rows = 0;        // the SM count
  int mma_sparse_max_rows = 0;  // steps of <= this many tokens: DSA rows on MlaDecodeMma beside FlashInfer's decode
  tuner::AttentionPlan attention_plan;  // choose_attention()'s, from the device, the dims and the flag
  // FlashInfer's SM90 MLA for dense-attention layers' prefill / mixed steps (eager only: its
  // schedule is planned on the host per step from host_batch; null: the own kernel).
  std::unique_ptr<cuda::attention::MlaSm90> mla_prefill;
  const KvBatchView* host_batch = nullptr;  // the step's batch (host), set around an eager forward
  bool prefill_planned = false;             // mla_prefill planned for this forward

  // Device sampling: pinned mirrors of s.sample_in / sample_out / sample_hist (plan_sampling).
  PinnedInts sample_in_host, sample_out_host, sample_hist_host;
  int64_t sample_rows = 0, sample_steps = 0, sample_hist_ints = 0;  // S, K, S·(max_context + K)
  // Sizes of s.sample_in (bytes: per row the parameters and 4 ints) and s.sample_out (ints: per
  // step and row a token, a logprob and the top logprobs' ids and values); plan_memory and
  // plan_sampling both use them.
  static size_t sample_in_bytes(int64_t rows);
  static size_t sample_out_ints(int64_t steps, int64_t rows);
  void plan_sampling();
  // Validates the rows' parameters (one line), packs and uploads them (extra: tokens a K-step
  // launch appends to penalised histories). Enqueue only.
  SampleLaunch upload_sampling(std::span<const RowSampling> rows, int64_t extra);
  // sample() of step j over logits [n, vocab] into the step's slice of s.sample_out.
  void run_sample(const SampleLaunch& L, float* logits, int64_t j);
  // Enqueues the copies of K steps' results into sample_out_host; after the synchronisation
  // sampled_token reads row r of step j.
  void read_sampled(const SampleLaunch& L, int64_t K);
  GeneratedToken sampled_token(const SampleLaunch& L, int64_t K, int64_t j, int64_t r) const;
  // Grammar masks: s.token_masks' bytes; its pinned mirror (slots then masks, the same layout);
  // whether the device slots hold any row's (else all -1, as plan_sampling leaves them).
  static size_t token_mask_bytes(int64_t logits_rows, int64_t rows, int64_t vocab);
  PinnedInts token_mask_host;
  bool token_masks_set = false;
  // StepInput::token_masks packed and uploaded in one copy (a step without any: the slots reset
  // to -1 by one memset when the last step had masks, else nothing). Enqueue only.
  void upload_token_masks(std::span<const uint32_t* const> masks);
  void clear_token_masks() { upload_token_masks({}); }
  // forward()'s mask launch over logits rows [0, rows) (captured in the graphs: slot -1 rows cost one load).
  void apply_token_masks(int rows);

  // Graphs per decode bucket.
  std::map<int64_t, GraphEntry> graphs;
  std::map<int64_t, GraphEntry> mtp_graphs;  // the MTP layer's draft steps (one token per request), same buckets
  bool graphs_enabled = true;
  bool said_eager = false;

  ~Impl();
  // Checkpoint layer of each runner layer (the identity unless opt.replicate_layers).
  std::vector<int64_t> layer_src;
  void load_weights(const model::ModelWeights& w, Loader& loader);
  // One decoder block's weights (a target layer or the MTP layer's block); P: its tensor prefix.
  void load_layer(const model::LayerWeights& lw, DeviceLayer& L, const std::string& P, Loader& ld);
  // RunnerOptions::mtp: the MTP layer's weights (an Error, one line, when the checkpoint has none).
  void load_mtp(const model::ModelWeights& w, Loader& ld);
  // The MTP layer over the uploaded metadata (T tokens of R requests), its input hidden states
  // already in s.o (BF16): enqueue only (its output states stay in s.h), so it is captured too.
  void forward_mtp(int T, int R, int rows, int max_ctx, bool decode);
  void capture_mtp_graphs(const std::vector<int64_t>& buckets);  // after capture_graphs (gpu_mtp.cpp)
  // One bucket's graph: `forward` run once eagerly (plans, lazy loading), then captured,
  // instantiated and uploaded; a throw during the capture ends it and destroys the graph.
  GraphEntry capture_bucket(int64_t B, const std::function<void()>& forward);
  void run_mtp(const MtpStepInput& in, const MtpStepOutput& out);  // GpuRunner::mtp_step
  // GpuRunner::spec_round_greedy (gpu_spec_round.cpp): its block (every step's metadata, the
  // round's inputs, drafts, hidden rows, outputs; grown on demand, outside the memory plan).
  void run_spec_round(const GreedyRoundInput& in, GreedyRoundOutput& out);
  cuda::DeviceBuffer round_dev;
  PinnedInts round_host;
  std::vector<uint16_t> h_stage;  // host BF16 [T, hidden]: StepOutput::final_hidden down, MtpStepInput::h_in up
  // opt.replicate_layers: extends cfg and layer_src; returns the extra bytes to upload.
  size_t replicate_layers();
  void plan_memory();
  // Builds the attention kernels the tuner's attention plan picks (opt.attention_kernels, the
  // dims, the device; a refused override throws one line) and reserves their workspace (before
  // plan_memory: the KV pool takes what is left); sets attention_line.
  void choose_attention();
  void capture_graphs();
  // Fills the pinned metadata for `in` (padded to `pad_tokens` tokens / requests when > T) and
  // copies it to the device.
  void upload_meta(const StepInput& in, int64_t pad_to);
  // upload_meta's first half: validates and fills the pinned mirror only (the speculative round
  // stages every step's metadata with it before one upload, gpu_spec_round.cpp).
  void fill_meta(const StepInput& in, int64_t pad_to);
  // The decode graph of a batch of B decode tokens (null: eager; says once when above the cap).
  const GraphEntry* decode_graph(int64_t B);
  // Per-expert counts buffers, the decode block, the events (after plan_memory).
  void plan_counters();
  // tests (opt.poison): the activations NaN before a step.
  void poison_activations();
  // A stage boundary of a timed forward (no-op unless `marks`).
  void mark(StepStage s);
  // Enqueues the whole forward for T tokens of R requests reading the device metadata: model/'s
  // layer stack with the CUDA op set (cuda_ops.hpp). rows: logits rows (gathered by meta.rows);
  // max_ctx (>= every position + 1) sizes the indexer grid and the fast attention's split grid;
  // decode: every request has exactly one token (token t = request t), so the fast decode kernel
  // may run. hidden / choices (eager only): filled when set.
  void forward(int T, int R, int rows, int max_ctx, bool decode, model::HiddenStates* hidden,
               StepChoices* choices = nullptr);
  // Plans mla_prefill for this forward when it can take the step (see gpu_step.cpp).
  void plan_prefill(int T, bool decode);
  DeviceBatch batch(int T, int R) const;
  LinearCtx lctx() { return {&blas, meta.offsets, s.fp4_ws, stream}; }
};

// Buckets of the decode graphs: 1, 2, 4, 8, then multiples of 8 up to 64, then of 32, ... (<= max).
std::vector<int64_t> graph_buckets(int64_t max_bs);

}  // namespace fp4moe::engine::gpu
