// Token permutation for the MoE layer: per-expert counts and offsets (on the device),
// token rows scattered into expert-contiguous order, the inverse map for the combine,
// and the combine itself.
//
// Pairs: every token has R = k + X rows ("slots"): its k routed slots (experts from
// topk_ids, in rank order) and then X = extra_experts always-selected slots (expert E + j
// for slot k + j, weight exactly 1: the folded shared expert's pieces). Pairs are
// numbered p = t*R + slot, so the permuted matrix always has M_total = T*R rows (known on
// the host); only its split into the E + X experts lives on the device.
// Order (deterministic): expert e owns rows [offsets[e], offsets[e+1]); inside an
// expert, rows are ordered by pair index, i.e. by token, then by slot.
//
// Routing weight: applied by the down GEMM (Epilogue::RowScale with row_weight); the
// combine only sums the R rows of a token (plus the separate shared expert's row, when the
// shared expert is not folded).
// Everything only enqueues on `stream` (no host sync, no memset nodes): graph-capturable.
//
// Two paths, same results bit for bit: pairs <= kPermuteFusedMaxPairs: ONE kernel whose
// CTAs each rebuild the (small) permutation in shared memory and gather their share of the
// rows (CTA 0 writes the maps and offsets); above: chunk counts -> one-CTA scan -> stable
// ranks -> gather (4 launches, bandwidth-bound).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda {

inline constexpr int kPermuteChunk = 1024;  // pairs per CTA in the count/rank kernels
inline constexpr int kMaxPermuteExperts = 1024;   // E + extra_experts
inline constexpr int kMaxPermuteExtraExperts = 8;
inline constexpr int kPermuteFusedMaxPairs = 1024;  // fused one-kernel path up to this many pairs

// Scratch (bytes) the permutation needs for up to max_pairs pairs (T*R) and E + X experts.
size_t permute_scratch_bytes(int64_t max_pairs, int num_experts);

struct PermuteArgs {
  const int32_t* topk_ids = nullptr;   // [T, k]
  const float* topk_weights = nullptr; // [T, k]
  int tokens = 0, top_k = 0;
  int num_experts = 0;                 // E, routed (ids outside [0, E) are dropped)
  int extra_experts = 0;               // X: experts E..E+X-1 selected by every token, weight 1
  int32_t* expert_offsets = nullptr;   // [E+X+1] out
  int32_t* row_pair = nullptr;         // [T*R] out: pair index of permuted row r
  int32_t* pair_row = nullptr;         // [T*R] out: permuted row of pair p (inverse map)
  float* row_weight = nullptr;         // [T*R] out: routing weight of permuted row r
  void* scratch = nullptr;             // permute_scratch_bytes(T*R, E+X)
  // Optional: also gather the token rows (x [T, hidden] bf16 -> x_perm [T*R, hidden]), fused
  // into the permutation kernel on the small path (= gather_rows_bf16 afterwards).
  const uint16_t* x = nullptr;
  uint16_t* x_perm = nullptr;
  int hidden = 0;
};
void build_permutation(const PermuteArgs& a, cudaStream_t stream);

// x_perm[r, :] = x[row_pair[r] / R, :]   (bf16, hidden % 8 == 0, 16-byte aligned rows;
// rows_per_token = R, the pair stride)
void gather_rows_bf16(const uint16_t* x, const int32_t* row_pair, int rows, int rows_per_token, int hidden,
                      uint16_t* x_perm, cudaStream_t stream);

// out[t, :] = sum_{s<R} y[pair_row[t*R+s], :] (+ shared[t, :] when shared != null), summed
// in FP32 in slot order (routed slots in rank order, then the folded shared pieces, then
// `shared`); out is f32 or bf16. R = rows_per_token.
void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens,
                  int rows_per_token, int hidden, float* out_f32, cudaStream_t stream);
void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens,
                  int rows_per_token, int hidden, uint16_t* out_bf16, cudaStream_t stream);

// The same with an FP32 shared term (the BF16 shared expert's down output, moe/shared_bf16.hpp);
// shared may be null.
void combine_rows_f32_shared(const uint16_t* y, const int32_t* pair_row, const float* shared, int tokens,
                             int rows_per_token, int hidden, float* out_f32, cudaStream_t stream);
void combine_rows_f32_shared(const uint16_t* y, const int32_t* pair_row, const float* shared, int tokens,
                             int rows_per_token, int hidden, uint16_t* out_bf16, cudaStream_t stream);

// h[t, j] = bf16(SiLU(gate_up[t, j]) · gate_up[t, inter + j]) for gate_up [tokens, 2·inter] f32
// (gate columns first, as the checkpoint's gate_up rows), h [tokens, inter] bf16; inter % 4 == 0,
// 16-byte aligned rows. FP32 math (expf), one rounding: what the FP4 GEMM's SiluMul epilogue
// and the CPU layer (bf16 activations) compute.
void silu_mul_rows(const float* gate_up, int tokens, int inter, uint16_t* h, cudaStream_t stream);

// offsets[0] = 0, offsets[1] = rows: the one-expert "grouped" GEMM of the shared expert.
void fill_single_expert_offsets(int32_t* offsets, int rows, cudaStream_t stream);

}  // namespace fp4moe::cuda
