// Grammar masks on the device (constrained decoding): F32 logit rows get -inf wherever the row's
// vocabulary bitmask has a clear bit (bit v % 32 of word v / 32, the layout of grammar/ and of
// cpu::apply_token_bitmask, this op's CPU reference; checked by tests/ops). Runs in place before
// the greedy argmax and the device sampler, so every sampling mode sees the masked row.
//
// Rows without a constraint skip it through a per-row slot index (-1), not an all-ones mask:
// an unconstrained row then costs 4 B uploaded and 4 B read per CTA instead of ⌈vocab/32⌉·4 B
// each way (19,360 B at GLM-5's 154,880; 1.24 MB per step at 64 rows, 19.8 MB at 1,024),
// and the masks of the constrained rows are packed (slot = their order), so one step uploads
// rows·4 + constrained·⌈vocab/32⌉·4 bytes. Launch only, graph capturable (every size a host
// value, the slots and masks read from device memory at fixed addresses).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::sampling {

// Mask words per row: ⌈vocab / 32⌉.
inline int64_t token_mask_words(int64_t vocab) { return (vocab + 31) / 32; }

// For r < rows: mask_slot[r] < 0 leaves logits row r as is; else logits[r * logits_stride + v] =
// -inf for every v < vocab whose bit in masks[mask_slot[r] * mask_words ...] is clear (the bits
// past vocab in the last word are ignored). Logits past vocab are never touched.
void apply_token_bitmask_f32(float* logits, int64_t logits_stride, int rows, int vocab, const int32_t* mask_slot,
                             const uint32_t* masks, int64_t mask_words, cudaStream_t s);

}  // namespace fp4moe::cuda::sampling
