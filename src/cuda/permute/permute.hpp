// Token permutation for the MoE layer: per-expert counts and offsets (on the device),
// token rows scattered into expert-contiguous order, the inverse map for the combine,
// and the combine itself.
//
// Pairs: the T*k (token, slot) pairs are numbered p = t*k + slot. Every pair goes to
// exactly one expert, so the permuted matrix always has M_total = T*k rows (known on
// the host); only its split into experts lives on the device.
// Order (deterministic): expert e owns rows [offsets[e], offsets[e+1]); inside an
// expert, rows are ordered by pair index, i.e. by token, then by slot.
//
// Routing weight: applied by the down GEMM (Epilogue::RowScale with row_weight); the
// combine only sums the k rows of a token plus the shared expert's row.
// Everything only enqueues on `stream` (no host sync): graph-capturable.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda {

inline constexpr int kPermuteChunk = 1024;  // pairs per CTA in the count/rank kernels
inline constexpr int kMaxPermuteExperts = 1024;

// Scratch (int32) the permutation needs for up to max_pairs pairs and E experts.
size_t permute_scratch_bytes(int64_t max_pairs, int num_experts);

struct PermuteArgs {
  const int32_t* topk_ids = nullptr;   // [T, k]
  const float* topk_weights = nullptr; // [T, k]
  int tokens = 0, top_k = 0, num_experts = 0;
  int32_t* expert_offsets = nullptr;   // [E+1] out
  int32_t* row_pair = nullptr;         // [T*k] out: pair index of permuted row r
  int32_t* pair_row = nullptr;         // [T*k] out: permuted row of pair p (inverse map)
  float* row_weight = nullptr;         // [T*k] out: routing weight of permuted row r
  void* scratch = nullptr;             // permute_scratch_bytes(T*k, E)
};
void build_permutation(const PermuteArgs& a, cudaStream_t stream);

// x_perm[r, :] = x[row_pair[r] / k, :]   (bf16, hidden % 8 == 0, 16-byte aligned rows)
void gather_rows_bf16(const uint16_t* x, const int32_t* row_pair, int rows, int top_k, int hidden,
                      uint16_t* x_perm, cudaStream_t stream);

// out[t, :] = sum_{s<k} y[pair_row[t*k+s], :] (+ shared[t, :] when shared != null),
// summed in FP32 in slot order; out is f32 or bf16.
void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens,
                  int top_k, int hidden, float* out_f32, cudaStream_t stream);
void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens,
                  int top_k, int hidden, uint16_t* out_bf16, cudaStream_t stream);

// offsets[0] = 0, offsets[1] = rows: the one-expert "grouped" GEMM of the shared expert.
void fill_single_expert_offsets(int32_t* offsets, int rows, cudaStream_t stream);

}  // namespace fp4moe::cuda
