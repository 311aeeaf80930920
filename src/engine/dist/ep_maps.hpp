// Expert-parallel dispatch / combine index maps: from each token's top-k expert ids and
// weights, what every rank sends to every other rank (the all-to-all's counts and offsets),
// how a rank groups what it received by local expert, and how the expert outputs come back
// and are summed. Host arithmetic only; the GPU path builds the same maps (or their device
// twin) and hands the counts to NCCL. Tested on the CPU with simulated ranks
// (tests/engine/dist_ep_test.cpp) against the single-rank CPU MoE.
//
// Tokens: every rank holds the same hidden states after a TP attention (or a replicated
// one); rank s is the *source* of tokens token_owner[s] (contiguous blocks, multiples of
// `granule` tokens except the last, so that kernel token tiles fall as on one rank).
//
// Dispatch (one all-to-all): source s sends token t's row once to every rank d that owns one
// or more of t's experts (deduplicated), ascending t. Rank d's receive buffer is the
// concatenation over s = 0..N-1, so its rows are in ascending global token order.
// Local: row i of d carries local_ids[i·K + j] = (expert − d's first expert) for slot j when d
// owns that slot's expert, else −1; expert_entries groups the (row, slot) pairs by local
// expert (rows ascending), what a grouped GEMM consumes.
// Return (one all-to-all): d sends back one row per valid (row, slot), in row order, so the
// rows for source s are contiguous; source s receives them concatenated over d.
// Combine: token t's output = Σ over its slots in ascending expert id of w·y (one fused
// multiply-add per term, starting from 0), the same order and roundings as
// cpu::moe_forward_cpu, so the result is bit-identical to one rank's (then + shared expert).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/dist/shard_plan.hpp"

namespace fp4moe::dist {

struct EpRouting {
  int64_t tokens = 0, top_k = 0;
  const int32_t* ids = nullptr;      // [T, K] global expert ids (distinct per token)
  const float* weights = nullptr;    // [T, K]
};

struct CombineTerm {
  int64_t back_row = 0;  // row of the source's return buffer
  float weight = 0.0f;
};

struct DispatchPlan {
  int64_t ranks = 0, tokens = 0, top_k = 0;
  std::vector<Range> token_owner;  // [N] tokens each rank sources
  std::vector<Range> experts;      // [N] experts each rank owns

  // Dispatch all-to-all, [s·N + d]: token ids s sends to d; counts and offsets in rows.
  std::vector<std::vector<int32_t>> send_tokens;
  std::vector<int64_t> send_counts, send_offsets;  // offsets within s's send buffer
  std::vector<int64_t> recv_counts, recv_offsets;  // [d·N + s]: within d's receive buffer
  std::vector<int64_t> recv_rows;                  // [N] rows each rank receives

  // On rank d: [recv_rows[d] · K] local expert id per (row, slot) or −1; the (row·K + slot)
  // entries grouped by local expert ([n_local + 1] offsets).
  std::vector<std::vector<int32_t>> local_ids;
  std::vector<std::vector<int32_t>> expert_entries;
  std::vector<std::vector<int64_t>> expert_offsets;

  // Return all-to-all: [d] the (row·K + slot) entries d sends back, in order; counts and
  // offsets [d·N + s] within d's send-back buffer, [s·N + d] within s's receive-back buffer.
  std::vector<std::vector<int32_t>> back_entries;
  std::vector<int64_t> back_send_counts, back_send_offsets;
  std::vector<int64_t> back_recv_counts, back_recv_offsets;
  std::vector<int64_t> back_rows;  // [N] rows each source receives back

  // [T · K], token-major: token t's terms in ascending expert id; rows in the buffer of the
  // token's source rank.
  std::vector<CombineTerm> combine;
};

// Token blocks of `granule` tokens over `ranks` sources (the last block takes the rest).
std::vector<Range> token_blocks(int64_t tokens, int64_t ranks, int64_t granule);

// Checks the routing (ids in [0, E), distinct per token, finite weights) with one line.
DispatchPlan plan_dispatch(const EpRouting& routing, const std::vector<Range>& experts, int64_t num_experts,
                           int64_t granule = 8);

// Source rank s: out [token_owner[s].size(), H] = combine of its tokens from its
// receive-back buffer back [back_rows[s], H] (overwrites out).
void combine_rows(const DispatchPlan& plan, int64_t s, const float* back, int64_t hidden, float* out);

}  // namespace fp4moe::dist
