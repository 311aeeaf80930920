// Which MLA prefill form to run for a chunk of dense (causal, not DSA-sparse) attention:
//   absorbed  MlaSm90 (mla.hpp): attention in the 576 / 512-wide latent space, no expansion;
//   expanded  MlaPrefillExpandedSm90 (mla_prefill.hpp): K / V expanded per head from the latent
//             by kv_b_proj, then FA3 at head dims 256 / 256.
// Why a rule: the expanded form does less than half the attention work per (query, key, head)
// (2 · (256 + 256) flops against 2 · (576 + 512)) but first pays for every context token once
// (the expansion GEMM, 2 · 512 · 64 · 448 = 29 MFLOP, and its 64 KB of K / V). A chunk with few
// new tokens per context token (decode, short chunks over a long prefix) does not earn that
// back; a long chunk does. With an FP8 cache the absorbed form is FlashInfer's slow FP8 path
// (~150 TFLOP/s) while the expanded form dequantizes once in its gather, so the expanded form
// wins from far shorter chunks.
// The rule compares two time estimates fitted to the H200 bench of commit 5783e9e (64 heads):
// absorbed = its B = 1 decode latency at 1K (20 µs BF16 KV, 46 µs FP8 KV) + its flops at the
// rate of the 4K–32K fresh prefills (580 TFLOP/s BF16 KV, 152 FP8 KV); expanded = 61 µs +
// its flops (attention + expansion) at 640 TFLOP/s (both fits within ~15 % of every measured
// point, 1K–32K). The result: a fresh prefill takes the expanded form from ~1.2K tokens with a
// BF16 cache (measured: 1.05x faster at 1K, 1.79x at 4K, 2.2x at 8K+) and from ~260 tokens with
// an FP8 cache (3.9x faster at 1K); a chunk at the end of a 128K prefix from ~340 (BF16) / ~60
// (FP8) new tokens. Below 1K the estimates are extrapolated: `fp4moe bench attention` prints
// the rule's pick beside both measured times for every prefill length (256 and 512 included).
// With DSA (GLM-5), rows past the top-k (2048) attend sparsely (MlaSm90::plan_sparse) whatever
// this rule says; it decides the dense part of a prefill.
#pragma once

#include <cstdint>

#include "core/paged_kv.hpp"

namespace fp4moe::cuda::attention {

enum class MlaPrefillForm { Absorbed, Expanded };

struct MlaPrefillChoice {
  MlaPrefillForm form = MlaPrefillForm::Absorbed;
  double absorbed_us = 0, expanded_us = 0;  // the estimates compared (H200, see above)
};

// One request's chunk: q_len new tokens at the end of a context of kv_len tokens (q_len <=
// kv_len), num_heads query heads, the cache element type. q_len <= 0 -> Absorbed, zero times.
MlaPrefillChoice choose_mla_prefill_form(int64_t q_len, int64_t kv_len, KvElem kv_elem, int num_heads = 64);

}  // namespace fp4moe::cuda::attention
