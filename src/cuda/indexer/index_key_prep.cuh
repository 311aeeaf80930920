// The indexer key of each new token in one launch (index_key_prep in indexer.hpp; run on the CPU
// by tests/cuda/index_key_prep_emu_test.cpp): LayerNorm with weight and bias over its 128 dims,
// RoPE on the first rope_dim of them, and the write into its slot of the paged index-key cache
// (BF16, or E4M3 of x / scale). FP32 from the BF16 input to the one rounding at the write, as the
// CPU model computes it (model/attention.cpp: layer_norm_rows, rope_rows, kv_append_cpu); the
// runner's unfused path rounds to BF16 after the LayerNorm as well.
// One warp per token, 4 consecutive dims per lane: the interleaved pairs (2i, 2i + 1) stay in a
// lane; the halves layout (i, i + rope_dim / 2) takes its partner from lane + rope_dim / 8.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/attention/kv_device.cuh"

namespace fp4moe::cuda::indexer::keyprep {

constexpr int kDim = 128;
constexpr int kPerLane = kDim / 32;
constexpr int kWarpsPerBlock = 8;

struct Params {
  const uint16_t* k;  // [T, k_stride] BF16 bits
  int64_t k_stride;
  const float* ln_w;
  const float* ln_b;
  float eps;
  int rope_dim;  // even, <= 128; a multiple of 8 for the halves layout
  bool interleaved;
  const float* inv_freq;  // [rope_dim / 2]
  float attn_factor;
  void* out;  // the layer's index_k array: [slots, 128] BF16 or E4M3 codes
  bool fp8;
  float scale;  // E4M3: code = e4m3(x / scale)
  attention::KvTokenSlots slots;
};

namespace {

// Grid: ceil(T / kWarpsPerBlock) blocks of kWarpsPerBlock warps.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) index_key_prep_kernel(const Params p) {
  const int t = int(blockIdx.x) * kWarpsPerBlock + prims::warp_id();
  if (t >= p.slots.tokens) return;  // the whole warp
  const int lane = prims::lane_id(), d0 = lane * kPerLane;
  float x[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) x[i] = prims::bf16_bits_to_float(p.k[int64_t(t) * p.k_stride + d0 + i]);
  // Every other load before the first use of any (one memory round trip for all of them, and the
  // slot's chain of dependent loads beside it): the weights and bias, the rope frequencies of
  // this lane's dims (fr[i]: dim d0 + i's, 0 where not rotated), the position, the slot.
  const int half = p.rope_dim / 2;
  const bool first = d0 < half, rotated = d0 < p.rope_dim;
  float lw[kPerLane], lb[kPerLane], fr[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    lw[i] = p.ln_w[d0 + i], lb[i] = p.ln_b[d0 + i];
    const int d = d0 + i;
    fr[i] = p.interleaved ? (d < p.rope_dim ? p.inv_freq[d / 2] : 0.f) : rotated ? p.inv_freq[first ? d : d - half] : 0.f;
  }
  const float pos = float(p.slots.positions[t]);
  const int64_t slot = attention::token_slot(p.slots, t);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) s += x[i];
  const float mean = prims::warp_sum(s) / float(kDim);
  float v = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) v += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / sqrtf(prims::warp_sum(v) / float(kDim) + p.eps);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) x[i] = (x[i] - mean) * inv * lw[i] + lb[i];

  if (p.interleaved) {
#pragma unroll
    for (int j = 0; j < kPerLane; j += 2) {
      const int d = d0 + j;
      if (d < p.rope_dim) {
        const float a = fr[j] * pos;
        const float c = cosf(a) * p.attn_factor, sn = sinf(a) * p.attn_factor;
        const float x0 = x[j], x1 = x[j + 1];
        x[j] = x0 * c - x1 * sn;
        x[j + 1] = x1 * c + x0 * sn;
      }
    }
  } else {
    const int src = !rotated ? lane : first ? lane + half / kPerLane : lane - half / kPerLane;
    float z[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) z[i] = __shfl_sync(prims::kFullMask, x[i], src);
    if (rotated) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const float a = fr[i] * pos;
        const float c = cosf(a) * p.attn_factor, sn = sinf(a) * p.attn_factor;
        x[i] = first ? x[i] * c - z[i] * sn : x[i] * c + z[i] * sn;
      }
    }
  }

  if (slot < 0) return;  // never write outside the pool
  if (p.fp8) {
    auto* o = static_cast<uint8_t*>(p.out) + slot * kDim + d0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) o[i] = uint8_t(prims::float_to_e4m3_bits(__fdiv_rn(x[i], p.scale)));
  } else {
    auto* o = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out) + slot * kDim + d0);
    o[0] = prims::pack_bf16x2(x[0], x[1]);
    o[1] = prims::pack_bf16x2(x[2], x[3]);
  }
}

}  // namespace

}  // namespace fp4moe::cuda::indexer::keyprep
