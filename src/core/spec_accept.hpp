// Greedy acceptance of a speculative round as plain data: one request's verdict from its drafts
// and the target's argmax over its verify rows. The device round's kernel (cuda/step's
// spec_accept_greedy) and its CPU reference (spec_accept_greedy_cpu, below) run this one function
// per request, so tests check the kernel against the same rule the host round applies
// (model/speculative.cpp's greedy path: emit the target's choice at row k; go on while it equals
// draft k; the bonus is the choice at the first mismatch or at row n).
// The stop ids and max_new cut the run with the K-step decode's rule (launch_finishes).
#pragma once

#include <cstdint>

#include "core/greedy_advance.hpp"
#include "core/host_device.hpp"

namespace fp4moe::cpu {

struct SpecAcceptArgs {
  int32_t requests = 0;
  int32_t max_drafts = 0;                // N: the stride of drafts, out has N + 1 per request
  int32_t stop_stride = 0;               // stop ids per request (-1 padded)
  const int32_t* drafts = nullptr;       // [R, N] d_1 .. d_n of request r (n = num_drafts[r] <= N)
  const int32_t* num_drafts = nullptr;   // [R]
  const int32_t* verify_offset = nullptr;  // [R] request r's first verify row (its n + 1 rows follow)
  const int32_t* target = nullptr;       // [verify rows] the target's argmax of every verify row
  const int32_t* max_new = nullptr;      // [R] >= 1: tokens the round may emit
  const int32_t* stop_ids = nullptr;     // [R, stop_stride]
  int32_t* out = nullptr;                // [R, N + 1] emitted tokens, -1 after the last
  int32_t* count = nullptr;              // [R] tokens emitted (1 .. n + 1)
  int32_t* accepted = nullptr;           // [R] drafts accepted
  int32_t* last_row = nullptr;           // [R] verify row of the last emitted token (verify_offset + count - 1)
};

// Request r's verdict: row k's choice is emitted; the run goes on while it equals draft k + 1
// (counted as accepted) and the emitted token does not finish the request (launch_finishes with
// produced = tokens emitted so far in the round).
FP4MOE_HD void spec_accept_greedy_row(const SpecAcceptArgs& a, int32_t r) {
  const int32_t n = a.num_drafts[r], off = a.verify_offset[r], N = a.max_drafts;
  int32_t* out = a.out + int64_t(r) * (N + 1);
  int32_t emitted = 0, acc = 0;
  for (int32_t k = 0; k <= n; ++k) {
    const int32_t t = a.target[off + k];
    out[k] = t;
    emitted = k + 1;
    const bool match = k < n && t == a.drafts[int64_t(r) * N + k];
    const bool end = launch_finishes(t, emitted, a.max_new[r], a.stop_ids + int64_t(r) * a.stop_stride, a.stop_stride);
    if (!match) break;
    ++acc;
    if (end) break;
  }
  for (int32_t k = emitted; k <= N; ++k) out[k] = -1;
  a.count[r] = emitted;
  a.accepted[r] = acc;
  a.last_row[r] = off + emitted - 1;
}

inline void spec_accept_greedy_cpu(const SpecAcceptArgs& a) {
  for (int32_t r = 0; r < a.requests; ++r) spec_accept_greedy_row(a, r);
}

}  // namespace fp4moe::cpu
