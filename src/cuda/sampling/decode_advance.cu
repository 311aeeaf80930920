// decode_advance(): one thread per row, after sample() of step j (sampling.hpp's DecodeState).
#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/sampling/sampling.hpp"

namespace fp4moe::cuda::sampling {
namespace {

__global__ void decode_advance_kernel(DecodeState s, const int32_t* tokens, int32_t j) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= s.rows) return;
  int32_t* out = s.out_tokens + int64_t(j) * s.rows + r;
  if (s.finish[r] != kRunning) {
    *out = kNoToken;
    s.kv_slot[r] = s.dead_slot;
    return;
  }
  const int32_t t = tokens[r];
  *out = t;
  const int64_t hist_pos = int64_t(s.prompt_len[r]) + s.generated[r];
  const bool hist_room = hist_pos < s.history_stride;
  if (hist_room) s.history[r * s.history_stride + hist_pos] = t;
  const int32_t generated = s.generated[r] + 1;
  s.generated[r] = generated;
  const int32_t next_pos = s.position[r] + 1;
  int32_t reason = kRunning;
  for (int q = 0; q < s.stop_stride; ++q) {
    const int32_t stop = s.stop_ids[r * s.stop_stride + q];
    if (stop != kNoToken && stop == t) reason = int32_t(FinishReason::kStop);
  }
  if (reason == kRunning && (generated >= s.max_new[r] || next_pos + 1 >= s.max_position[r])) reason = int32_t(FinishReason::kLength);
  if (reason == kRunning && !hist_room) reason = int32_t(FinishReason::kNoHistory);
  const int32_t page = next_pos / s.page_size;
  if (reason == kRunning && page >= s.pages[r]) reason = int32_t(FinishReason::kNoPage);
  if (reason != kRunning) {
    s.finish[r] = reason;
    s.finish_step[r] = j;
    s.kv_slot[r] = s.dead_slot;
    return;
  }
  s.input_token[r] = t;
  s.position[r] = next_pos;
  s.kv_slot[r] = int64_t(s.page_table[r * s.page_stride + page]) * s.page_size + next_pos % s.page_size;
}

}  // namespace

void decode_advance(const DecodeState& s, const int32_t* tokens, int32_t step, cudaStream_t stream) {
  check_decode_state(s);
  FP4MOE_CHECK(step >= 0 && step < s.k_steps, "decode_advance: step {} outside 0..{}", step, s.k_steps - 1);
  FP4MOE_CHECK(tokens != nullptr || s.rows == 0, "decode_advance: no tokens");
  if (s.rows == 0) return;
  constexpr int kThreads = 128;
  decode_advance_kernel<<<(s.rows + kThreads - 1) / kThreads, kThreads, 0, stream>>>(s, tokens, step);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda::sampling
