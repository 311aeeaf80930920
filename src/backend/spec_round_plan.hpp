// The host-side plan of a greedy speculative round on a device (backend/cuda/gpu_spec_round.cpp;
// model/speculative.hpp's GreedyRoundInput): every step's batch and the index arrays that move
// tokens and states between the steps on the device. Plain host code, so the CPU tests run the
// same plan over the CPU model (tests/backend/spec_round_plan_test.cpp).
//   - draft step k (k = 0 .. D − 1, D = max n − 1): the requests with n > k + 1, one token each at
//     start + k (input d_{k+1}: drafts[src[i]]; output d_{k+2}: drafts[dst[i]]); its input states
//     are the previous step's output rows prev[i] (step 0: the requests' MTP states);
//   - verify: [last, d_1 .. d_n] of every request as decode rows (backend/decode_rows.hpp), row k
//     of request r at verify_offset[r] + k; its token j is drafts[verify_src[j]] (or the request's
//     last token where verify_src is -1);
//   - catch-up: the MTP layer over the verify rows (same batch; tokens = the target's choices,
//     states = the verify rows' final states; logits of every row, the first R rows patched to
//     each request's last emitted row: the same GEMM rows as the host round's catch-up in this
//     form, model::SpecSteps::catchup_over_verify_rows).
// drafts: [R, N], d_1 of request r at r·N (first_draft), -1 where not drafted yet.
#pragma once

#include <cstdint>
#include <vector>

#include "core/paged_kv.hpp"
#include "model/speculative.hpp"

namespace fp4moe::engine {

struct SpecRoundStep {
  std::vector<int32_t> tokens, positions, qo, kv_len, page_indptr, pages, rows;
  KvBatchView batch() const {
    return {int64_t(qo.size()) - 1, int64_t(tokens.size()), qo.data(), positions.data(), kv_len.data(),
            page_indptr.data(), pages.data()};
  }
};

struct SpecRoundPlan {
  int64_t requests = 0, max_drafts = 0;
  std::vector<SpecRoundStep> drafts;                // D steps; tokens 0 (patched on the device)
  std::vector<std::vector<int32_t>> who;            // per draft step: its requests
  std::vector<std::vector<int32_t>> src, dst, prev; // per draft step [T_k]: drafts index in, out; row in step k − 1
  SpecRoundStep verify;                             // decode rows; tokens: last token or 0 (patched)
  std::vector<int32_t> verify_src, verify_offset;   // [Tv], [R]
  SpecRoundStep catchup;                            // verify's batch and rows [Tv] (0 .. R − 1 patched)
  std::vector<int32_t> drafts_init;                 // [R·N]
};

// Validates the input (one line: sizes, draft counts, first drafts inside `vocab`, pages, hidden
// states where a request drafts twice) and builds the plan.
SpecRoundPlan plan_spec_round(const model::GreedyRoundInput& in, int64_t page_size, int64_t vocab);

}  // namespace fp4moe::engine
