// Internal to cuda/attention: the MLA decode kernels' configuration and parameters
// (mla_decode_mma.cuh) in plain C++, for the host planner (mla_decode.cpp) and the launches
// (mla_decode_mma.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/host_device.hpp"
#include "cuda/attention/mla_decode_config.hpp"

#if !defined(FP4MOE_CUDA_EMU)  // the emulator test defines the CUDA types itself
#include <cuda_runtime_api.h>
#endif

namespace fp4moe::cuda::attention::decode {

// One work item: keys [kv_start, kv_end) of query token `token`; key i's cache slot is
// (table[i >> page_shift] << page_shift) + (i & (page_size - 1)) with table = kv_indices +
// table_offset (page_shift 0: a list of slots, the DSA case). partial: -1 -> write the output
// directly, else the row of part_o / part_lse this item writes.
struct Item {
  int32_t token, kv_start, kv_end, partial, table_offset, pad[3];
};
static_assert(sizeof(Item) == 32, "");

// A token whose keys were split: its partial rows [first, first + count).
struct Merge {
  int32_t token, first, count, pad;
};

// The split schedule of MlaDecodeMma::run_device (graph-capturable), computed ON THE DEVICE where
// it is used: the decode kernel's CTA t * splits + i takes item i of row t, the merge kernel's CTA
// t row t's merge (mla_decode_mma.cuh's device_item / device_merge), from the row's length in
// device memory. Row t has L keys: dense (top_k == 0) L = kv_len[t] with the page table at
// page_indptr[t]; sparse (top_k > 0) L = min(top_k, positions[t] + 1) with the slot list at
// t * top_k. It uses n = the host rule's part count for L capped at `splits` (parts of >= 2
// tiles, whole tiles); items n .. splits - 1 are empty (kv_start == kv_end: the CTA returns at
// once) and a merge of count 0 (n == 1: the item writes the output) is skipped. L must be >= 1
// (a row with L <= 0 gets only empty items: its output is not written).
struct DeviceSchedule {
  const int32_t* kv_len;       // dense: [tokens]
  const int32_t* page_indptr;  // dense: [tokens + 1]
  const int32_t* positions;    // sparse: [tokens]
  int top_k;                   // 0: dense
  int tokens, splits, tile_keys;
};

struct Params {
  const uint16_t* q_nope;      // [T, heads, 512] BF16
  const uint16_t* q_pe;        // [T, heads, 64] BF16
  const uint8_t* ckv;          // latent pool [slots, 512] of the cache element
  const uint8_t* kpe;          // rope pool [slots, 64]
  const int32_t* kv_indices;   // page tables (dense) or slot lists (sparse)
  const Item* items;
  int page_shift;
  int num_heads;               // a multiple of 64; grid.y = num_heads / 64
  float sm_scale;              // softmax scale of q . k
  float ckv_scale, kpe_scale;  // FP8 per-array scales (1 for BF16)
  uint16_t* out;               // [T, heads, 512] BF16
  float* lse;                  // optional [T, heads], natural log
  float* part_o;               // [partials, heads, 512] FP32, normalized
  float* part_lse;             // [partials, heads], base 2
  const Merge* merges;
  DeviceSchedule sched;        // when items / merges are null: computed from it (run_device)
};

// The split rule, one for the host schedule (build_schedule) and the kernels' in-place one
// (DeviceSchedule): `tiles` tiles in about `want` parts of >= 2 tiles each (one part when the row
// has fewer than 4 tiles), every part but the last `per_tiles` tiles.
struct PartSplit {
  int n, per_tiles;
};
FP4MOE_HOST_DEVICE inline PartSplit split_parts(int tiles, int want) {
  const int cap = tiles / 2 > 1 ? tiles / 2 : 1;
  const int n = want < 1 ? 1 : want > cap ? cap : want;
  const int q = (tiles + n - 1) / n;
  const int per = q > 1 ? q : 1;
  const int parts = (tiles + per - 1) / per;
  return {parts > 1 ? parts : 1, per};
}

// The split schedule (host): token t's keys [0, kv_len[t]) in parts of whole tiles (>= 2
// tiles each, unless the token has fewer), about `slots` parts in all (the CTA slots: SMs per
// head group), each token getting its share by length; items longest first.
struct Schedule {
  std::vector<Item> items;
  std::vector<Merge> merges;
  int partials = 0;
};
Schedule build_schedule(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& table_offset, int slots,
                        int tile_keys);


#if !defined(FP4MOE_CUDA_EMU)
// The decode kernel over items x head_groups CTAs, then (merges > 0) the merge kernel; pdl:
// both with programmatic dependent launch (cuda/common/launch.cuh); wgmma: the wgmma variant
// (sm_90a); ws: the warp-specialized FP8 variant (mla_decode_ws.cuh, sm_90a, 384 threads), with
// ws_q_regs its Q held in registers.
cudaError_t launch(bool fp8, const Params& p, int items, int head_groups, int merges, cudaStream_t stream,
                   bool pdl = false, bool wgmma = false, bool ws = false, bool ws_q_regs = false);
#endif

}  // namespace fp4moe::cuda::attention::decode
