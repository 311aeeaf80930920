// MLA attention (absorbed form) over the paged latent cache on SM90, through FlashInfer
// 0.7.2.post1's BatchMLAPageAttentionHopper, wrapped thinly: our plain structs, our planner
// object (FlashInfer's MLAPlan underneath), our workspace. One kernel serves
//   - decode:        q_len = 1 per request, any kv_len (1 .. 128K+);
//   - prefill:       ragged, causal, chunked (q_len new tokens at the END of kv_len cached
//                    tokens: token j of a request sits at position kv_len - q_len + j and
//                    sees positions <= its own);
//   - sparse (DSA):  every query row is its own "request" with q_len 1 and page_size 1, the
//                    page table being the row's top-k slot ids (plan_sparse).
// The absorbed form: q_nope here is already q_nope · W_UK (512 wide, the latent space),
// q_pe the rotated 64-wide rope query; the output is in the latent space (512 wide, before
// W_UV). Scores are sm_scale · (q_nope·ckv + q_pe·kpe); softmax over the visible keys.
//
// Layout: core/paged_kv.hpp (KvLayerView / KvBatchView). KV: BF16, or FP8 E4M3 with the
// per-array ckv / kpe scales. Q and O: BF16. LSE (optional): natural log, as cpu/attention.
// Heads: a power of two <= 128 (FlashInfer packs heads x queries into 64/128-row tiles; other
// counts would split a query across tiles at the causal bound).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/attention/mla_fi_schedule.hpp"

namespace fp4moe::cuda::attention {

struct MlaDesc {
  int num_heads = 64;
  float sm_scale = 0.0625f;       // GLM-5: (192 + 64)^-1/2
  KvElem kv_elem = KvElem::BF16;  // BF16 or FP8_E4M3
};

// The current device's compute capability as 10 * major + minor (90 for an H100 / H200).
int current_device_sm();

// Why this desc cannot run here ("" when it can): head count, element type, arch (sm_90 only),
// FlashInfer built in.
std::string mla_can_implement(const MlaDesc& d, int sm);

struct MlaRunArgs {
  const void* q_nope = nullptr;   // [tokens, heads, 512] BF16 (contiguous; W_UK already folded in)
  const void* q_pe = nullptr;     // [tokens, heads, 64]  BF16 (contiguous, rotated)
  KvLayerView layer;              // device arrays: ckv / kpe of elem, ckv_dim 512, kpe_dim 64
  // Dense: the batch's page_indices (device, the CSR order given to plan()).
  // Sparse: [rows, top_k] cache slots (device), e.g. indexer::top_k's out_slot.
  const int32_t* kv_indices = nullptr;
  void* out = nullptr;            // [tokens, heads, 512] BF16
  float* lse = nullptr;           // optional [tokens, heads] FP32, natural log
};

// The rows of a device-scheduled run (MlaSm90::run_device, MlaDecodeMma::run_device), all
// arrays in DEVICE memory.
struct MlaDeviceRows {
  int tokens = 0;    // query rows; dense: row t = request t (one new token each, at kv_len - 1)
  int max_keys = 0;  // >= every row's key count: sizes the split grid (not read for correctness)
  // dense (top_k == 0): row t's keys are positions [0, kv_len[t]) through the page table at
  // kv_indices + page_indptr[t] (pages of page_size, a power of two)
  const int32_t* kv_len = nullptr;
  const int32_t* page_indptr = nullptr;
  int64_t page_size = 0;
  // sparse (top_k > 0): row t's keys are the first min(top_k, positions[t] + 1) cache slots of
  // kv_indices[t * top_k ..] (indexer::top_k's out_slot)
  const int32_t* positions = nullptr;
  int top_k = 0;
  // Splits per row: 0 = device_splits' rule; else forced (rows x splits <= 2 x SMs, the partial
  // buffer). bench attention sweeps it beside the rule.
  int splits = 0;
  // Programmatic dependent launch (sm_90+, cuda/common/launch.cuh) for our kernels of the run:
  // MlaDecodeMma's decode and merge kernels, MlaSm90's schedule kernel (FlashInfer's
  // own kernel launches plainly). Each may start launching while the kernel before it finishes,
  // and waits for it before touching memory. Off by default; bench attention measures it.
  bool pdl = false;
};

// Planner + workspace for one MlaDesc on the current device. plan() is host work (the split /
// load-balance schedule) plus one async H2D copy of the schedule; run() enqueues one
// cooperative launch. One object per concurrently used plan (the layers of one step share
// one: the schedule depends on lengths only). Not thread-safe.
class MlaSm90 {
 public:
  explicit MlaSm90(const MlaDesc& desc);
  ~MlaSm90();
  MlaSm90(const MlaSm90&) = delete;
  MlaSm90& operator=(const MlaSm90&) = delete;

  // Dense / prefill. `batch` in HOST memory, validated against the pool (validate_kv_batch);
  // the kernel's causal rule needs each request's tokens to be the LAST q_len positions of its
  // context, in order (positions[qo_indptr[r] + j] = kv_len[r] - q_len + j); else an Error.
  void plan(const KvBatchView& batch, int64_t page_size, int64_t num_pages, cudaStream_t stream);
  // Sparse: token t attends to the min(top_k, positions[t] + 1) first entries of its top-k row
  // (indexer::top_k leaves -1 padding only after them). `batch` in HOST memory.
  void plan_sparse(const KvBatchView& batch, int top_k, cudaStream_t stream);

  void run(const MlaRunArgs& a, cudaStream_t stream) const;

  // Graph-capturable decode (64 heads, one query token per row): no host plan. run_device()
  // enqueues a kernel that writes FlashInfer's schedule from the rows' DEVICE arrays
  // (cuda/attention/mla_fi_schedule.hpp: a fixed split count per row, chosen from rows.tokens
  // and rows.max_keys alone), then the same FlashInfer kernel as run(). Its own workspace,
  // allocated once by reserve_device() (never during a capture); independent of plan()/run().
  void reserve_device(int max_rows);
  void run_device(const MlaRunArgs& a, const MlaDeviceRows& rows, cudaStream_t stream) const;
  // The split count run_device uses for `rows` rows of at most max_keys keys.
  int device_splits(int rows, int max_keys) const;

  bool planned_sparse() const { return sparse_; }
  int planned_tokens() const { return tokens_; }
  int planned_works() const { return works_; }
  const MlaDesc& desc() const { return desc_; }
  // Device bytes of the float workspace (partial O / LSE of split KV).
  static size_t float_workspace_bytes(int num_sm);
  // Its partial rows: 2 x clusters x cluster_tile_q = 2 x SMs x 64 (MLAPlan's and run_device's).
  static size_t partial_rows(int num_sm) { return size_t(2) * size_t(num_sm) * 64; }
  static constexpr size_t kIntWorkspaceBytes = size_t(1) << 20;
  // FlashInfer's schedule holds at most this many work items and does not check; plan()
  // refuses batches that could exceed it (split a long prefill into query chunks).
  static constexpr int kMaxWorks = 16384;

 private:
  void plan_impl(const std::vector<int32_t>& q_indptr, const std::vector<int32_t>& kv_indptr,
                 const std::vector<int32_t>& kv_len, cudaStream_t stream);
  void check_run_args(const MlaRunArgs& a, const char* who) const;
  // The FlashInfer kernel over a schedule (plan vector, workspaces), as run() and run_device() share it.
  void launch(const std::vector<int64_t>& info, void* float_ws, void* int_ws, int page_size, const MlaRunArgs& a,
              cudaStream_t stream) const;
  MlaDesc desc_;
  int num_sm_ = 0;
  void* float_ws_ = nullptr;
  void* int_ws_ = nullptr;
  void* pinned_ = nullptr;
  size_t float_bytes_ = 0;
  cudaEvent_t copied_ = nullptr;
  std::vector<int64_t> plan_info_;
  int tokens_ = 0, works_ = 0, page_size_ = 0, top_k_ = 0;
  bool planned_ = false, sparse_ = false;
  // run_device's schedule (int) and partial O / LSE (float) workspaces, and its plan vector
  // (FlashInfer's MLAPlanInfo order: grid, then the arrays' offsets; fixed by reserve_device)
  void* dev_int_ws_ = nullptr;
  void* dev_float_ws_ = nullptr;
  std::vector<int64_t> dev_info_;
  fi_sched::Layout dev_layout_{};
  int dev_rows_ = 0;
};

// Host checks shared by the planners: the batch is valid for the pool (validate_kv_batch), has
// a request, and each request's tokens are the last q_len positions of its context, in order.
void check_prefill_batch(const KvBatchView& b, int64_t page_size, int64_t num_pages);

}  // namespace fp4moe::cuda::attention
