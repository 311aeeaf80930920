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
#include <string>

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

// The new tokens' latent keys prepared and written in one launch (kv_latent_prep.cuh): ckv =
// RMSNorm(kv[:, :512]) times norm_w, kpe = RoPE(kv[:, 512:576]) (interleaved pairs or halves;
// angle inv_freq[i] * position in FP32, cos / sin * attn_factor), each written into the token's
// slot (BF16, or E4M3 of x / ckv_scale | kpe_scale). FP32 to the one rounding at the write (the
// CPU model's order). Replaces an RMSNorm launch, a RoPE launch and the latent part of the
// append (the index key is index_key_prep's, cuda/indexer). Slots outside the pool are skipped.
struct KvLatentPrepArgs {
  const void* kv = nullptr;  // [T, kv_stride] BF16: the kv_a projection, [latent 512 | rope 64]
  int64_t kv_stride = 576;   // a multiple of 8 (16-byte rows; kv 16-byte aligned)
  const float* norm_w = nullptr;  // [512]
  float eps = 1e-6f;
  bool interleaved = true;
  const float* inv_freq = nullptr;  // [32]
  float attn_factor = 1.0f;
  KvLayerView layer;  // ckv / kpe arrays (512 / 64), elem BF16 or FP8_E4M3 (ckv_scale, kpe_scale)
  KvBatchView batch;  // device: qo_indptr, positions, page_indptr, page_indices
};
// Empty when it can run (latent 512, rope 64), else why not.
std::string kv_latent_prep_can_implement(int64_t ckv_dim, int64_t kpe_dim);
void kv_latent_prep(const KvLatentPrepArgs& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::attention
