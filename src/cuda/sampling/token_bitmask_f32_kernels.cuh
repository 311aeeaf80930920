// The kernel behind token_bitmask_f32.hpp. Kernels only: token_bitmask_f32.cu launches it,
// tests/ops/backend_ops_emu_test runs it through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"

namespace fp4moe::cuda::sampling::tokenmask {

inline constexpr int kMaskThreads = 256;
inline constexpr int kMaskLogitsPerThread = 4;
inline constexpr int kMaskLogitsPerBlock = kMaskThreads * kMaskLogitsPerThread;  // 1,024 logits = 32 mask words
inline int mask_grid_x(int vocab) { return (vocab + kMaskLogitsPerBlock - 1) / kMaskLogitsPerBlock; }

namespace {

// Grid (mask_grid_x(vocab), rows). Thread t of block x covers logits x·1,024 + k·256 + t, k < 4:
// a warp's 32 logits share one mask word (one broadcast load), its -inf stores are coalesced,
// and the logits are never read. A row whose slot is -1 returns at once (one 4-byte load).
__global__ void token_bitmask_kernel(float* logits, int64_t stride, int vocab, const int32_t* mask_slot,
                                     const uint32_t* masks, int64_t words) {
  const int32_t slot = mask_slot[blockIdx.y];
  if (slot < 0) return;
  const uint32_t* m = masks + int64_t(slot) * words;
  float* row = logits + int64_t(blockIdx.y) * stride;
  const int base = int(blockIdx.x) * kMaskLogitsPerBlock + int(threadIdx.x);
  for (int k = 0; k < kMaskLogitsPerThread; ++k) {
    const int v = base + k * kMaskThreads;
    if (v >= vocab) break;  // v grows with k
    if (!((m[v >> 5] >> (v & 31)) & 1u)) row[v] = -INFINITY;
  }
}

}  // namespace
}  // namespace fp4moe::cuda::sampling::tokenmask
