// A multi-token batch as a decode step (the speculative verify step on the GPU,
// backend/cuda/gpu_spec_steps.hpp): token t of request r becomes a request of its own at
// position p = positions[t] with kv_len p + 1 over the first ⌈(p + 1) / page_size⌉ pages of r —
// so every row runs a one-token decode step's kernels, and rows of one request share its pages
// (row k's cache write is in place before row k + 1 reads it: every layer appends before it
// attends). Host code; the arrays are owned here.
#pragma once

#include <cstdint>
#include <vector>

#include "core/paged_kv.hpp"

namespace fp4moe::engine {

struct DecodeRows {
  std::vector<int32_t> qo, kv_len, page_indptr, pages;
  KvBatchView view(const KvBatchView& b) const;  // T requests of one token; positions: b's
};

// Throws fp4moe::Error (one line) for a token outside its request's kv_len or pages.
DecodeRows decode_rows(const KvBatchView& b, int64_t page_size);

}  // namespace fp4moe::engine
