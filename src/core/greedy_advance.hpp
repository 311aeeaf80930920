// The bookkeeping between two steps of a K-step decode launch, as plain data and its CPU
// reference. cuda/step's greedy_advance kernel takes the same struct (device pointers there,
// host pointers here), so tests run both on one set of arrays.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fp4moe::cpu {

// The decode metadata a K-step launch advances in place (request r's one token is flat token
// r) and its per-launch limits and results.
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

// The finishing rule of a launch (greedy_advance, and the device speculative round's acceptance,
// core/spec_accept.hpp): after emitting token t as its produced-th token of the launch, a request
// stops when produced reaches max_new or t is one of its stop ids (-1 padded, `stride` of them).
FP4MOE_HD bool launch_finishes(int32_t t, int32_t produced, int32_t max_new, const int32_t* stop_ids, int32_t stride) {
  bool done = produced >= max_new;
  for (int32_t q = 0; q < stride && !done; ++q) done = stop_ids[q] == t;
  return done;
}

// After step j's token (argmax or sampled, in `greedy`): a running request r records
// out[j·B + r] = greedy[r] and produced[r]++; it finishes on a stop id or produced == max_new
// (then it is a dummy at position 0, kv_len 1, on the trash page: its first page entry becomes
// trash_page); otherwise its token, position and kv_len advance by one. A finished request
// writes -1 and changes nothing else.
void greedy_advance_cpu(const GreedyAdvanceArgs& a, int32_t step);

}  // namespace fp4moe::cpu
