// Our MLA decode attention (absorbed form) for one query token per row: dense decode (every
// request has q_len 1) and DSA sparse rows (each token over its top-k slots), BF16 or FP8 E4M3
// cache, 64 or 128 heads. Warp-level mma.sync with the FP8 cache converted to FP16 in registers
// (no BF16 copy of the tile), split over the keys of long rows and merged by a second kernel;
// a plain launch (no cooperative grid). Kernels: mla_decode_mma.cuh. Same arguments and the
// same results (to rounding) as MlaSm90, its baseline; the bench runs both.
//   plan() / plan_sparse(): host work (the split schedule) and one async H2D copy;
//   run(): one or two launches. One object per concurrently used plan. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/attention/mla.hpp"

namespace fp4moe::cuda::attention {

// The tensor-core instructions of the decode kernel: warp-level mma.sync (sm_89+), or Hopper's
// warpgroup wgmma (sm_90; S and O as m64 accumulators of a warpgroup, Q / K / V read by the tensor
// cores from shared memory instead of ldmatrix into registers; an FP8 cache's tiles converted to
// FP16 in shared memory first, each thread its own copies). BF16 or FP8 cache either way.
// kWgmmaWs: the warp-specialized wgmma kernel (sm_90, FP8 E4M3 cache only): a producer
// warpgroup copies and converts each tile once into an FP16 ring that two consumer warpgroups'
// wgmma read (mla_decode_ws.cuh), so loads and conversions overlap the MMAs. kWgmmaWsQRegs: the
// same with most of Q held in registers (QK's A operand; less shared-memory traffic): a bench
// row beside kWgmmaWs until measured, not selectable by --attention-kernels.
enum class DecodeMath { kMmaSync, kWgmma, kWgmmaWs, kWgmmaWsQRegs };

// "" when MlaDecodeMma can run desc on the current device, else why not (heads, element
// type, shared memory per block: ~217 KB, so not sm_120's 99 KB; wgmma: sm_90; wgmma-ws: sm_90
// and an FP8 cache).
std::string mla_decode_can_implement(const MlaDesc& d, DecodeMath math = DecodeMath::kMmaSync);

class MlaDecodeMma {
 public:
  explicit MlaDecodeMma(const MlaDesc& desc, DecodeMath math = DecodeMath::kMmaSync);
  ~MlaDecodeMma();
  MlaDecodeMma(const MlaDecodeMma&) = delete;
  MlaDecodeMma& operator=(const MlaDecodeMma&) = delete;

  // Dense decode: `batch` in HOST memory, validated against the pool; every request has exactly
  // one new token, at position kv_len - 1. run()'s kv_indices = the batch's page_indices.
  void plan(const KvBatchView& batch, int64_t page_size, int64_t num_pages, cudaStream_t stream);
  // Sparse: token t attends to the min(top_k, positions[t] + 1) first entries of its row of
  // run()'s kv_indices ([T, top_k] cache slots). `batch` in HOST memory (positions used).
  void plan_sparse(const KvBatchView& batch, int top_k, cudaStream_t stream);
  void run(const MlaRunArgs& a, cudaStream_t stream) const;

  // Graph-capturable variant: no host plan. run_device() enqueues the decode and merge kernels
  // over a grid fixed by (rows.tokens, rows.max_keys) alone; each CTA computes its item (or merge)
  // of the split schedule from its row's length in DEVICE memory (kv_len / page_indptr, or
  // positions) — so a graph captured once replays correctly with any lengths in later steps (each
  // row's split count is capped by the captured grid; a row shorter than max_keys leaves its
  // unused items empty). Its own workspace (the partial rows), allocated by reserve_device() once
  // (never during a capture); run_device() refuses more rows than reserved. The plan()/run() pair
  // is independent of it.
  void reserve_device(int max_tokens);
  void run_device(const MlaRunArgs& a, const MlaDeviceRows& rows, cudaStream_t stream) const;
  // The split count run_device uses for `tokens` rows of at most `max_keys` keys.
  int device_splits(int tokens, int max_keys) const;

  int planned_items() const { return items_; }
  int planned_partials() const { return partials_; }

 private:
  void plan_items(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& table_offset, int page_shift,
                  cudaStream_t stream);
  MlaDesc desc_;
  bool wgmma_ = false, warp_specialized_ = false, ws_q_regs_ = false;
  int num_sm_ = 0;
  void* int_ws_ = nullptr;    // items, merges (device)
  void* pinned_ = nullptr;    // staging (host)
  void* float_ws_ = nullptr;  // partial O and LSE (device)
  size_t int_bytes_ = 0, float_bytes_ = 0;
  cudaEvent_t copied_ = nullptr;
  int items_ = 0, partials_ = 0, merges_ = 0, page_shift_ = 0, tokens_ = 0;
  int64_t page_size_ = 0;
  bool planned_ = false, sparse_ = false;
  // run_device's workspace: the partial rows [slots] (its schedule is computed in the kernels)
  void* dev_float_ws_ = nullptr;
  int dev_tokens_ = 0;
};

}  // namespace fp4moe::cuda::attention
