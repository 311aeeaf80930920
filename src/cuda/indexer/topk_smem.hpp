// Internal to cuda/indexer, plain C++ (no CUDA headers): the radix top-k's one-CTA row sizes and
// the shared memory its select kernel takes (topk_radix.cuh launches by these), for the launch
// (indexer_topk_radix.cu) and the tuner's attention plan (tuner/attention_plan.cpp), which
// judges an arch without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fp4moe::cuda::indexer::topk {

constexpr int kRowKeys = 16384;       // one-CTA rows (keys in shared memory), every arch
constexpr int kRowKeysLarge = 32768;  // the same up to 32K keys: 145 KB of shared memory (sm_90 / sm_100)
constexpr int kBins0 = 4096;          // first digit: key bits [31:20]
constexpr int kScratchInts = 64;

// The select kernel's shared memory for rows of max_ctx keys, rows of <= row_keys on one CTA.
inline size_t select_smem_bytes(int max_ctx, int row_keys = kRowKeys) {
  const int keys = max_ctx < row_keys ? max_ctx : row_keys;  // long rows: the sample, <= 8K keys
  return (kBins0 + kScratchInts) * sizeof(int) + size_t(keys) * sizeof(uint32_t);
}

// The most keys a row may have to take one CTA on a device allowing smem_optin bytes per block:
// kRowKeysLarge where its 147,712 B fit (sm_90, sm_100), else kRowKeys (sm_120's ~99 KB).
inline int max_one_cta_keys(int64_t smem_optin) {
  return int64_t(select_smem_bytes(kRowKeysLarge, kRowKeysLarge)) <= smem_optin ? kRowKeysLarge : kRowKeys;
}

}  // namespace fp4moe::cuda::indexer::topk
