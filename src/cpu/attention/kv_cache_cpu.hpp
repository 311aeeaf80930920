// CPU ops on the paged KV cache (layout: core/paged_kv.hpp): append a step's keys, read a
// slot back. Host memory only. The reference for cuda/attention's append kernel.
#pragma once

#include <cstdint>

#include "core/paged_kv.hpp"

namespace fp4moe::cpu {

// Encodes one float as a cache element (F32: as is; BF16: round to nearest even, NaN kept;
// FP8 E4M3: e4m3_from_float(x / scale), i.e. RNE and saturated to ±448, NaN -> 0x7F|sign).
void kv_encode(KvElem elem, float scale, const float* x, int64_t n, void* dst);
// Decodes n elements starting at element `offset` of an array of `elem` (value * scale for FP8).
void kv_decode(KvElem elem, float scale, const void* base, int64_t offset, int64_t n, float* out);

// Writes token t of the batch (flat index, 0 <= t < T) into the slot of its position
// (kv_slot(batch, layer.page_size, request of t, positions[t])) of every array given:
//   ckv      [T, layer.ckv_dim]    the normed latent (FP32)
//   kpe      [T, layer.kpe_dim]    the rotated rope key (FP32)
//   index_k  [T, layer.index_dim]  the indexer key after LayerNorm + RoPE (FP32), or nullptr
//                                  (then layer.index_k is left alone); given while the layer
//                                  has no index_k array is an error
// Each row is encoded with kv_encode (per-array scale). Other slots are not touched.
// The batch is validated first (validate_kv_batch); errors throw fp4moe::Error.
void kv_append_cpu(const KvLayerView& layer, const KvBatchView& batch, const float* ckv, const float* kpe,
                   const float* index_k);

// Reads slot `slot` (page * page_size + offset) back as FP32: ckv [ckv_dim], kpe [kpe_dim],
// index_k [index_dim] (each may be nullptr to skip it).
void kv_read_slot_cpu(const KvLayerView& layer, int64_t slot, float* ckv, float* kpe, float* index_k);

}  // namespace fp4moe::cpu
