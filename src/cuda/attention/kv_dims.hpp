// GLM-5 / DeepSeek-V3.2 attention dimensions the GPU kernels are built for, and host helpers
// shared by cuda/attention and cuda/indexer. The cache layout and the batch description are
// core/paged_kv.hpp's (KvLayerView, KvBatchView), with device pointers.
#pragma once

#include <cstdint>

namespace fp4moe::cuda::attention {

inline constexpr int kCkvDim = 512;    // kv_lora_rank
inline constexpr int kKpeDim = 64;     // qk_rope_head_dim
inline constexpr int kIndexDim = 128;  // index_head_dim
inline constexpr int kIndexHeads = 32; // index_n_heads
inline constexpr int kDefaultPageSize = 64;

// log2(x) when x is a power of two, else -1.
inline int log2_exact(int64_t x) {
  int s = 0;
  while (s < 62 && (int64_t(1) << s) < x) ++s;
  return (int64_t(1) << s) == x ? s : -1;
}

}  // namespace fp4moe::cuda::attention
