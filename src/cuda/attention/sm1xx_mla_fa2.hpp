// Blackwell MLA decode / prefill (sm_100a, sm_120a): FlashInfer 0.7.2.post1's portable MLA kernel
// (attention/mla.cuh, BatchMLAPagedAttention: FA2-style, mma.sync + cp.async, the same MLAParams,
// MLAPlan and paged KV layout as the SM90 kernel behind MlaSm90), so the engine keeps one cache
// format and one planner on every arch. COMPILED, NOT RUN.
//
// The kernel picks its tile from the SM's shared memory at launch (mla.cuh DISPATCH_SMEM_CONFIG):
// >= 221,696 B per SM (sm_100): 2 stages x 64 keys, QK sharded over 2 warpgroups; >= 92,672 B
// (sm_120's 102,400): 1 stage x 16 keys. An FP8 KV cache forces 32 keys and a BF16 repack copy;
// mla_fa2_smem() says what each needs, from the kernel's own SharedStorage type.
#pragma once

#include <cstdint>

namespace fp4moe::cuda::attention {

struct MlaFa2Smem {
  int64_t smem_per_sm = 0;      // the arch class the dispatch keys on (bytes per SM)
  int stages = 0, kv_tile = 0;  // BF16 KV config the dispatch picks there
  int64_t bf16_bytes = 0;       // sizeof(KernelTraits<...BF16 KV...>::SharedStorage)
  int fp8_kv_tile = 0;          // FP8 KV: tile forced to 32 keys, no QK sharding
  int64_t fp8_bytes = 0;        // sizeof(KernelTraits<...E4M3 KV...>::SharedStorage)
};

// The two Blackwell classes: [0] sm_100 (233,472 B per SM), [1] sm_120 (102,400 B per SM).
// Empty (count 0) in a build without sm_100a / sm_120a.
struct MlaFa2SmemTable {
  MlaFa2Smem rows[2];
  int count = 0;
};
MlaFa2SmemTable mla_fa2_smem();

}  // namespace fp4moe::cuda::attention
