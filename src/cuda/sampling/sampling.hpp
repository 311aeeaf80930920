// Sampling and multi-step decode bookkeeping on the device (every arch the engine builds).
//
// sample():       logits F32 [rows, vocab] -> one token per row (+ logprobs), by the scheme of
//                 core/sampling_scheme.hpp (penalties, greedy / temperature / top-k / top-p /
//                 min-p, Philox-seeded Gumbel-max draw). The host twin is
//                 cpu::sample_cpu (cpu/sampling_cpu.hpp): same tokens, per row.
// decode_advance(): after the sample of step j of a K-step launch: the token goes to the output
//                 ring and the request's history, becomes the next input, the position and KV
//                 slot advance, stop ids / lengths are checked; finished rows become no-ops.
//                 Host twin: decode_advance_cpu (below).
//
// Both are CUDA-graph capturable: no allocation, no host synchronisation, no host reads of
// device data; every size they need is in the arguments (host values fixed at capture).
// Per-row results depend only on that row's inputs (the same alone or batched), and are
// deterministic (no float atomics): graph replay == eager, bit for bit.
//
// Penalties are applied from each request's token list (prompt then output, DecodeState's
// history), not from per-request counts over the vocabulary: the list costs O(tokens) per
// request (counts would be vocab x 4 B = 620 KB per request at GLM-5's 154,880, 635 MB for
// 1,024 requests), the runner keeps the token ids anyway, and decode_advance appends to it.
// A row with penalties rewrites its penalised logits IN PLACE (only the listed tokens, once
// per distinct token, using a per-row bitmap in the workspace), so the logits must be fresh
// each call (they are: the lm_head writes them every step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/finish_reason.hpp"
#include "cuda/sampling/sample_args.hpp"

namespace fp4moe::cuda::sampling {

// ---- sample ----------------------------------------------------------------------------------
// SampleArgs: cuda/sampling/sample_args.hpp (plain C++, shared with the kernels' header).

// Device workspace for sample() (no initial contents needed): per row the penalty bitmaps (2 bits
// per vocabulary entry), a 2,048-bin histogram, chunk partials and a 4,096-entry candidate list:
// ~98 KB per row at vocab 154,880 (100 MB at 1,024 rows).
size_t sample_workspace_bytes(int64_t rows, int64_t vocab);

// Checks the host fields (rows, vocab, strides, pointers present); throws with one line.
void check_sample_args(const SampleArgs& a, size_t workspace_bytes);

// Three launches (sample_f32.cu); a row is split over several CTAs when the rows are few.
// Launch only: no synchronisation.
void sample(const SampleArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- multi-step decode state (device) -------------------------------------------------------
// One K-step decode launch of `rows` requests. Every pointer is device memory owned by the
// runner; the layout below is the contract (row r of a [rows, S] array starts at r * S).
//
//   per row [rows]            meaning
//   input_token  int32        the token the next step feeds in (written by decode_advance)
//   position     int32        its position (0-based index in the sequence)
//   kv_slot      int64        where the next step writes its KV: page_table[r][position / page_size]
//                             * page_size + position % page_size; a done row gets dead_slot
//   generated    int32        tokens generated so far (the RNG draw index, the penalty output_len)
//   max_new      int32        stop when generated reaches it (length)
//   max_position int32        the longest sequence (prompt + output) allowed: stop when reached
//   pages        int32        pages of page_table[r] reserved (>= those K more tokens need)
//   finish       int32        0 running, else a FinishReason; set once, never cleared here
//   finish_step  int32        the step j (0..K-1) whose token finished the request, -1 running
//   prompt_len   int32        prompt tokens at the head of the row's history
//
//   per row [rows, S]
//   stop_ids     int32 [rows, stop_stride]    stop token ids, kNoToken padded (<= stop_stride)
//   page_table   int32 [rows, page_stride]    page ids, the first `pages` valid
//   history      int32 [rows, history_stride] prompt then every generated token (penalties)
//
//   output ring  int32 [K, rows] out_tokens[j * rows + r]: the token of step j, kNoToken when
//                the row was already done before step j (the host reads it back once).
//
// The step j of a launch runs: model forward (input_token, position, kv_slot) -> logits ->
// sample(draw_index = generated, done = finish, history...) -> decode_advance(j). A row done
// before step j keeps its input_token and position, gets kv_slot = dead_slot (a scratch slot
// the runner reserves, as for graph padding rows) and writes kNoToken to out_tokens[j].
// finish[r] holds int32_t(FinishReason) (core/finish_reason.hpp): kStop when it sampled one of
// its stop ids (the stop token is the row's last output), kLength when generated == max_new or
// the sequence reached max_position tokens, kNoHistory when history_stride has no room for
// another token and kNoPage when the next position needs a page beyond `pages` (both the
// runner's bugs: reserve K).
constexpr int32_t kRunning = int32_t(FinishReason::kRunning);

struct DecodeState {
  int32_t rows = 0;              // host
  int32_t k_steps = 0;           // host, K >= 1
  int32_t page_size = 0;         // host, >= 1
  int32_t stop_stride = 0;       // host, >= 0
  int64_t page_stride = 0;       // host
  int64_t history_stride = 0;    // host
  int64_t dead_slot = -1;        // host: the KV slot finished rows write to
  int32_t* input_token = nullptr;
  int32_t* position = nullptr;
  int64_t* kv_slot = nullptr;
  int32_t* generated = nullptr;
  const int32_t* max_new = nullptr;
  const int32_t* max_position = nullptr;
  const int32_t* pages = nullptr;
  int32_t* finish = nullptr;
  int32_t* finish_step = nullptr;
  const int32_t* prompt_len = nullptr;
  const int32_t* stop_ids = nullptr;
  const int32_t* page_table = nullptr;
  int32_t* history = nullptr;
  int32_t* out_tokens = nullptr; // [k_steps, rows]
};

// SampleArgs' penalty and state fields from a DecodeState (logits, params and outputs are the
// caller's): draw_index = generated, done = finish, history / prompt_len / output_len.
void bind_decode_state(SampleArgs& a, const DecodeState& s);

// Checks the host fields; throws with one line.
void check_decode_state(const DecodeState& s);

// After sample() of step j (0 <= j < k_steps): tokens [rows] from it. One thread per row.
void decode_advance(const DecodeState& s, const int32_t* tokens, int32_t step, cudaStream_t stream);

// ---- host twin of decode_advance (the reference; same layout, host arrays) -------------------
struct DecodeStateHost {
  int32_t rows = 0, k_steps = 0, page_size = 0, stop_stride = 0;
  int64_t page_stride = 0, history_stride = 0, dead_slot = -1;
  std::vector<int32_t> input_token, position, generated, max_new, max_position, pages, finish, finish_step,
      prompt_len, stop_ids, page_table, history, out_tokens;
  std::vector<int64_t> kv_slot;
};
void decode_advance_cpu(DecodeStateHost& s, const int32_t* tokens, int32_t step);

}  // namespace fp4moe::cuda::sampling
