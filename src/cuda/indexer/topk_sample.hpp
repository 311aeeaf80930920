// The radix top-k's sample of a long row (topk_radix.cuh), plain C++ so that tests can build
// rows against it: of every `stride` lines of 32 keys, one, at a hashed offset (so that no period
// in the scores lines up with it); at most kSampleLines lines.
#pragma once

#include <cstdint>

namespace fp4moe::cuda::indexer::topk {

inline constexpr int kSampleLines = 256;  // 8K keys: the default, and the most a sample takes

// max_lines: the most lines the sample takes (TopKArgs::sample_lines, 32..kSampleLines).
constexpr int sample_stride(int ctx, int max_lines = kSampleLines) {
  const int lines = (ctx + 31) / 32;
  return (lines + max_lines - 1) / max_lines;
}
// The line sampled from group g (lines [g * stride, (g + 1) * stride)); may lie past the row's end.
constexpr int sample_line(int g, int stride) {
  return g * stride + int(((uint32_t(g) * 2654435761u) >> 16) % uint32_t(stride));
}

}  // namespace fp4moe::cuda::indexer::topk
