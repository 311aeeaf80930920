// Cache writes on the GPU: a step's new tokens into their slots of one layer's paged cache
// (core/paged_kv.hpp), the same op as cpu/attention/kv_cache_cpu.hpp's kv_append_cpu with BF16
// inputs. Token t of the batch goes to kv_slot(batch, page_size, request of t, positions[t]).
//   ckv      [T, 512] BF16   the normed latent (kv_a_layernorm output)
//   kpe      [T, 64]  BF16   the rope key after RoPE
//   index_k  [T, 128] BF16   the indexer key after LayerNorm + RoPE, or null (layer.index_k untouched)
// Encoding per array (BF16 copy, or FP8 E4M3 = RNE(x / scale) saturated to ±448, the per-array
// scale of the layer). One warp per token, all arrays in one launch; no host sync.
// The slots come from the (device) page table, which the engine validated on the host
// (validate_kv_batch); the kernel also skips any slot outside the pool rather than write it.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"

namespace fp4moe::cuda::attention {

struct KvAppendArgs {
  const void* ckv = nullptr;      // [T, 512] BF16
  const void* kpe = nullptr;      // [T, 64]  BF16
  const void* index_k = nullptr;  // [T, 128] BF16 or null
  KvLayerView layer;              // device arrays (elem / index_elem: BF16 or FP8_E4M3)
  KvBatchView batch;              // device: qo_indptr, positions, page_indptr, page_indices
};

void kv_append(const KvAppendArgs& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::attention
