// Per-step bookkeeping kernels of the GPU runner (enqueue only, graph capturable, every per-step
// value read from device memory):
//   - count_experts: the tokens routed to each expert by one MoE layer, real tokens only;
//   - greedy_advance: between two steps of a K-step greedy decode launch, the greedy token
//     becomes the next input, positions and kv_len advance, stop ids / max_new finish a request.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::engine::gpu {

// counts[e] = #{(t, j) : t < T, active[token_req[t]] != 0, ids[t·k + j] == e} for e < E
// (ids outside [0, E) are not counted). One CTA; E <= 4096.
void count_experts(const int32_t* ids, int T, int k, const int32_t* token_req, const int32_t* active, int E,
                   int32_t* counts, cudaStream_t s);

// The decode metadata a K-step launch advances in place (device pointers; request r's one token
// is flat token r) and its per-launch limits and results.
struct GreedyAdvanceArgs {
  int32_t requests = 0;     // B real requests (padding rows after them are left alone)
  int32_t stop_stride = 0;  // stop ids per request (-1 padded)
  int32_t trash_page = 0;   // where a finished request computes from now on
  const int32_t* greedy = nullptr;        // [B] this step's argmax per request
  int32_t* tokens = nullptr;              // [B] next input
  int32_t* positions = nullptr;           // [B]
  int32_t* kv_len = nullptr;              // [B]
  const int32_t* page_indptr = nullptr;   // [B + 1]
  int32_t* page_indices = nullptr;        // a finished request's first entry becomes trash_page
  int32_t* active = nullptr;              // [B] 1 running, 0 finished
  const int32_t* max_new = nullptr;       // [B] >= 1
  const int32_t* stop_ids = nullptr;      // [B, stop_stride]
  int32_t* produced = nullptr;            // [B] tokens produced so far in this launch
  int32_t* out = nullptr;                 // [K, B] step-major; -1 where the request was already finished
  // Sampled launches (null for greedy ones): a running request's draw index and output count
  // advance by one, its token goes to history[r · history_stride + prompt_len + output_len]
  // when that is inside the stride (the rows with penalties: the runner sized it), and done[r]
  // becomes 1 when it finishes (sample() skips it from then on).
  int32_t* draw = nullptr;
  int32_t* output_len = nullptr;
  const int32_t* prompt_len = nullptr;
  int32_t* history = nullptr;
  int64_t history_stride = 0;
  int32_t* done = nullptr;
};

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

}  // namespace fp4moe::engine::gpu
