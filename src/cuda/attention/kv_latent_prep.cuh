// The latent keys of each new token in one launch (kv_latent_prep in kv_append.hpp; run on the
// CPU by tests/cuda/kv_latent_prep_emu_test.cpp): RMSNorm with its weight over the 512 latent
// dims, RoPE on the 64 rope dims, and the writes into the token's slot of the paged latent and
// rope caches (BF16, or E4M3 of x / scale per array). FP32 from the BF16 projection to the one
// rounding at the write, as the CPU model computes it (model/attention.cpp: rms_norm_rows,
// rope_rows, kv_append_cpu); the runner's unfused path also rounds to BF16 after the norm and
// after the RoPE.
// One warp per token: 16 consecutive latent dims per lane; rope pair i = lane (interleaved: dims
// 2i, 2i + 1; halves: dims i, i + 32), so a lane rotates its own pair.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/attention/kv_device.cuh"

namespace fp4moe::cuda::attention::latentprep {

constexpr int kCkv = 512, kKpe = 64;
constexpr int kPerLane = kCkv / 32;  // 16
constexpr int kWarpsPerBlock = 8;
static_assert(kKpe == 64, "one rope pair per lane");

struct Params {
  const uint16_t* kv;  // [T, kv_stride] BF16 bits: [latent 512 | rope 64]; rows 16-byte aligned
  int64_t kv_stride;
  const float* norm_w;  // [512]
  float eps;
  bool interleaved;
  const float* inv_freq;  // [32]
  float attn_factor;
  void* ckv_out;  // the layer's latent cache [slots, 512]: BF16 or E4M3 codes
  void* kpe_out;  // the layer's rope cache [slots, 64]
  bool fp8;
  float ckv_scale, kpe_scale;  // E4M3: code = e4m3(x / scale)
  KvTokenSlots slots;
};

namespace {

__device__ __forceinline__ uint8_t e4m3(float x, float scale) {
  return uint8_t(prims::float_to_e4m3_bits(__fdiv_rn(x, scale)));
}

// Grid: ceil(T / kWarpsPerBlock) blocks of kWarpsPerBlock warps.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) kv_latent_prep_kernel(const Params p) {
  const int t = int(blockIdx.x) * kWarpsPerBlock + prims::warp_id();
  if (t >= p.slots.tokens) return;  // the whole warp
  const int lane = prims::lane_id(), d0 = lane * kPerLane;
  const uint16_t* row = p.kv + int64_t(t) * p.kv_stride;
  float x[kPerLane];
  {
    const uint4 a = *reinterpret_cast<const uint4*>(row + d0), b = *reinterpret_cast<const uint4*>(row + d0 + 8);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = prims::bf16_bits_to_float(uint16_t(w[i] & 0xffffu));
      x[2 * i + 1] = prims::bf16_bits_to_float(uint16_t(w[i] >> 16));
    }
  }
  const int r0 = p.interleaved ? 2 * lane : lane, r1 = p.interleaved ? 2 * lane + 1 : lane + kKpe / 2;
  const float y0 = prims::bf16_bits_to_float(row[kCkv + r0]), y1 = prims::bf16_bits_to_float(row[kCkv + r1]);
  // Every other load before the first use of any (one memory round trip for all of them, and the
  // slot's chain of dependent loads beside it): the weights, the frequency, the position, the slot.
  float w[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) w[i] = p.norm_w[d0 + i];
  const float f = p.inv_freq[lane], pos = float(p.slots.positions[t]);
  const int64_t slot = token_slot(p.slots, t);

  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / sqrtf(prims::warp_sum(ss) / float(kCkv) + p.eps);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) x[i] = w[i] * (x[i] * inv);

  const float a = f * pos;
  const float c = cosf(a) * p.attn_factor, sn = sinf(a) * p.attn_factor;
  const float z0 = y0 * c - y1 * sn, z1 = y1 * c + y0 * sn;

  if (slot < 0) return;  // never write outside the pool
  if (p.fp8) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = uint32_t(e4m3(x[4 * i], p.ckv_scale)) | (uint32_t(e4m3(x[4 * i + 1], p.ckv_scale)) << 8) |
             (uint32_t(e4m3(x[4 * i + 2], p.ckv_scale)) << 16) | (uint32_t(e4m3(x[4 * i + 3], p.ckv_scale)) << 24);
    *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.ckv_out) + slot * kCkv + d0) = uint4{w[0], w[1], w[2], w[3]};
    uint8_t* k = static_cast<uint8_t*>(p.kpe_out) + slot * kKpe;
    k[r0] = e4m3(z0, p.kpe_scale);
    k[r1] = e4m3(z1, p.kpe_scale);
  } else {
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = prims::pack_bf16x2(x[2 * i], x[2 * i + 1]);
    auto* o = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.ckv_out) + slot * kCkv + d0);
    o[0] = uint4{w[0], w[1], w[2], w[3]};
    o[1] = uint4{w[4], w[5], w[6], w[7]};
    uint16_t* k = static_cast<uint16_t*>(p.kpe_out) + slot * kKpe;
    const uint32_t z = prims::pack_bf16x2(z0, z1);
    k[r0] = uint16_t(z & 0xffffu);
    k[r1] = uint16_t(z >> 16);
  }
}

}  // namespace

}  // namespace fp4moe::cuda::attention::latentprep
