// Per-step bookkeeping kernels of the model runner (launch only, graph capturable, every
// per-step value read from device memory):
//   - count_experts: the tokens routed to each expert by one MoE layer, real tokens only;
//   - greedy_advance: between two steps of a K-step decode launch, the step's token becomes
//     the next input, positions and kv_len advance, stop ids / max_new finish a request;
//   - chunk_qo_indptr: a chunk of a batch's token rows as a batch of its own;
//   - spec_accept_greedy: the device speculative round's greedy acceptance (core/spec_accept.hpp);
//   - copy_indexed_i32: the round's token / row bookkeeping between its steps.
// CPU references: cpu/row_ops_cpu.hpp (count_experts_cpu, chunk_qo_indptr_cpu),
// core/greedy_advance.hpp (greedy_advance_cpu), core/spec_accept.hpp (spec_accept_greedy_cpu);
// checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/step/greedy_advance_args.hpp"
#include "core/spec_accept.hpp"

namespace fp4moe::cuda::step {

inline constexpr int kCountExpertsMaxExperts = 4096;

// counts[e] = #{(t, j) : t < T, active[token_req[t]] != 0, ids[t·k + j] == e} for e < E
// (ids outside [0, E) are not counted). One CTA; E <= 4096.
void count_experts(const int32_t* ids, int T, int k, const int32_t* token_req, const int32_t* active, int E,
                   int32_t* counts, cudaStream_t s);

// After step j's argmax (or sampled token, in `greedy`): a running request r records
// out[j·B + r] = greedy[r] and produced[r]++;
// it finishes on a stop id or produced == max_new (then it is a dummy at position 0 on the trash
// page: no more cache writes into its own pages, not counted by count_experts); otherwise its
// token, position and kv_len advance by one. A finished request writes -1.
void greedy_advance(const GreedyAdvanceArgs& a, int32_t step, cudaStream_t s);

// The request boundaries of the token rows [r0, r0 + n) of a batch, in the rows' own numbering:
// out[i] = min(max(qo_indptr[i] - r0, 0), n) for i in 0..R. With positions + r0 (and token_req +
// r0) it is a batch of n tokens whose request of each token is the original's (requests outside
// the rows become empty): the indexer's score and top-k launches over a chunk of rows.
void chunk_qo_indptr(const int32_t* qo_indptr, int32_t R, int32_t r0, int32_t n, int32_t* out, cudaStream_t s);

// Every request's verdict of a greedy speculative round: cpu::spec_accept_greedy_row per request
// (the rule shared with the CPU reference), device pointers in `a`.
void spec_accept_greedy(const cpu::SpecAcceptArgs& a, cudaStream_t s);

// dst[dst_index ? dst_index[i] : i] = src[src_index ? src_index[i] : i] for i < n, skipped where
// either index is negative (n may be 0: nothing is launched).
void copy_indexed_i32(int32_t* dst, const int32_t* dst_index, const int32_t* src, const int32_t* src_index, int32_t n,
                      cudaStream_t s);

}  // namespace fp4moe::cuda::step
