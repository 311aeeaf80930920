// Internal to cuda/attention: the MLA decode kernels' configuration and parameters
// (mla_decode_mma.cuh) in plain C++, for the host planner (mla_decode.cpp) and the launches
// (mla_decode_mma.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/host_device.hpp"

#if !defined(FP4MOE_CUDA_EMU)  // the emulator test defines the CUDA types itself
#include <cuda_runtime_api.h>
#endif

namespace fp4moe::cuda::attention::decode {

constexpr int kThreads = 256;
constexpr int kWarps = 8;
constexpr int kHeadsPerCta = 64;
constexpr int kCkv = 512, kKpe = 64, kQk = kCkv + kKpe;
constexpr int kStages = 3;

template <bool kFp8>
struct Cfg {
  static constexpr int kTk = kFp8 ? 64 : 32;                 // keys per tile
  static constexpr int kElem = kFp8 ? 1 : 2;                 // bytes per cached element
  static constexpr int kRowBytes = kQk * kElem;              // one key: [latent 512 | rope 64]
  static constexpr int kKvPitch = kRowBytes + 16;            // conflict-free ldmatrix rows
  static constexpr int kQPitch = kQk * 2 + (kFp8 ? 32 : 16);  // 16-bit Q rows (FP8: 8 B loads)
  static constexpr int kChunks = kRowBytes / 16;             // 16 B copies per key
  static constexpr int kLatentChunks = kCkv * kElem / 16;    // of which from the latent pool
  static constexpr int kNT = kTk / 8;                        // n8 tiles of S per warp
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQPitch;
  static constexpr size_t kStageBytes = size_t(kTk) * kKvPitch;
  static constexpr size_t kXchgBytes = size_t(kWarps) * kNT * 32 * 4 * sizeof(float);
  static constexpr size_t kSlotBytes = size_t(kStages) * kTk * sizeof(int64_t);  // the tiles' cache slots
  static constexpr size_t kConvBytes = 0;  // (the wgmma variant with an FP8 cache: its FP16 tiles)
  static constexpr size_t kSmemBytes = kQBytes + kStages * kStageBytes + kXchgBytes + 16 + kSlotBytes;
  static_assert((kKvPitch / 4) % 8 == 4, "KV rows must shift banks by 4 words (mod 32)");
  static_assert(kSmemBytes <= 227 * 1024, "");
};

// The wgmma variant (BF16 cache, sm_90a): Q and each KV tile stored as 8 x 8 core matrices of
// 128 contiguous bytes (no padding), [row / 8][dim / 8][row % 8][dim % 8]: the no-swizzle
// canonical layout (cuda/common/wgmma_prims.cuh) of Q and K as K-major operands and of V (the
// latent dims of the same tile) as an MN-major one.
struct CfgWg : Cfg<false> {
  static constexpr int kDimGroups = kQk / 8;                           // 72 core matrices per 8 rows
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQk * 2;    // 73,728
  static constexpr size_t kStageBytes = size_t(kTk) * kRowBytes;        // 36,864
  static constexpr size_t kSmemBytes = kQBytes + kStages * kStageBytes + kXchgBytes + 16 + kSlotBytes;
  static_assert(kSmemBytes <= 227 * 1024, "");
};

// The wgmma variant with an FP8 cache: tiles of 32 keys whose codes land as plain 576-byte rows,
// each thread converting the chunks it copied to FP16 (exact: E4M3 is a subset of FP16) into one
// of two core-matrix tiles (CfgWg's layout), which wgmma reads with the FP16 Q; P is FP16.
struct CfgWgFp8 : Cfg<true> {
  static constexpr int kTk = 32;
  static constexpr int kNT = kTk / 8;
  static constexpr int kDimGroups = kQk / 8;
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQk * 2;    // 73,728 (FP16)
  static constexpr size_t kStageBytes = size_t(kTk) * kRowBytes;        // 18,432 (codes)
  static constexpr size_t kConvBytes = size_t(kTk) * kQk * 2;           // 36,864 (one FP16 tile)
  static constexpr size_t kXchgBytes = size_t(kWarps) * kNT * 32 * 4 * sizeof(float);
  static constexpr size_t kSlotBytes = size_t(kStages) * kTk * sizeof(int64_t);
  static constexpr size_t kSmemBytes =
      kQBytes + kStages * kStageBytes + 2 * kConvBytes + kXchgBytes + 16 + kSlotBytes;
  static_assert(kSmemBytes <= 227 * 1024, "");
};

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


inline size_t smem_bytes(bool fp8, bool wgmma = false) {
  if (wgmma) return fp8 ? CfgWgFp8::kSmemBytes : CfgWg::kSmemBytes;
  return fp8 ? Cfg<true>::kSmemBytes : Cfg<false>::kSmemBytes;
}
inline int tile_keys(bool fp8, bool wgmma = false) {
  return wgmma ? CfgWg::kTk : fp8 ? Cfg<true>::kTk : Cfg<false>::kTk;
}
#if !defined(FP4MOE_CUDA_EMU)
// The decode kernel over items x head_groups CTAs, then (merges > 0) the merge kernel; pdl:
// both with programmatic dependent launch (cuda/common/launch.cuh); wgmma: the wgmma variant
// (sm_90a).
cudaError_t launch(bool fp8, const Params& p, int items, int head_groups, int merges, cudaStream_t stream,
                   bool pdl = false, bool wgmma = false);
#endif

}  // namespace fp4moe::cuda::attention::decode
