// The model runner's any-dims MLA over a paged FP8 (E4M3) latent cache: the same two ops as
// mla_warp_bf16.hpp (the same kernels, template kFp8) with the cache arrays in E4M3 and the
// layer's per-array scales (core/paged_kv.hpp: code = RNE(x / scale) saturated to ±448, value =
// decode(code) · scale). Queries, inputs and outputs stay BF16. Any arch; the fallback for dims
// the tuned kernels do not take (the tiny test models) and for the runner's mixed steps.
// CPU references: cpu/attention/kv_cache_cpu.hpp (kv_append_cpu on an FP8 layer, bit-exact),
// cpu/attention/mla_cpu.hpp; checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/common/device_batch.hpp"

namespace fp4moe::cuda::attention {

// The step's keys into their slots as E4M3 (layer.elem and, where index_k is written,
// layer.index_elem FP8_E4M3; scales positive and finite): ckv [T, ckv_dim] (row stride
// ckv_stride), kpe [T, kpe_dim] (kpe_stride), index_k [T, index_dim] contiguous or null, all BF16.
// code = e4m3(x · (1 / scale)), cpu::kv_encode's order. Tokens whose slot is outside the pool
// write nothing.
void kv_append_fp8(const KvLayerView& layer, const DeviceBatch& b, const uint16_t* ckv, int64_t ckv_stride,
                   const uint16_t* kpe, int64_t kpe_stride, const uint16_t* index_k, cudaStream_t s);

// mla_attention_warp_bf16's op over an E4M3 cache (layer.elem FP8_E4M3).
void mla_attention_warp_fp8(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pe_token_stride,
                            int64_t pe_head_stride, const KvLayerView& layer, const DeviceBatch& b, int heads,
                            float sm_scale, const int32_t* topk_slots, int topk_k, uint16_t* out, cudaStream_t s);

}  // namespace fp4moe::cuda::attention
