// Host side of cuda/sampling: argument checks, DecodeState binding and
// decode_advance_cpu, the host twin of decode_advance (written independently, plain loops).
#include "core/error.hpp"
#include "cuda/sampling/sampling.hpp"

namespace fp4moe::cuda::sampling {

void check_sample_args(const SampleArgs& a, size_t workspace_bytes) {
  FP4MOE_CHECK(a.rows >= 0 && a.rows <= 65535, "sample: rows {} outside 0 .. 65535", a.rows);
  FP4MOE_CHECK(a.vocab >= 1 && a.vocab < (1 << 23), "sample: vocab {} outside 1 .. 2^23", a.vocab);
  FP4MOE_CHECK(a.logits_stride >= a.vocab, "sample: logits stride {} < vocab {}", a.logits_stride, a.vocab);
  if (a.rows == 0) return;
  FP4MOE_CHECK(a.logits && a.params && a.tokens, "sample: logits, params and tokens are required");
  FP4MOE_CHECK(!a.top_ids == !a.top_logprobs, "sample: top_ids and top_logprobs go together");
  FP4MOE_CHECK(workspace_bytes >= sample_workspace_bytes(a.rows, a.vocab),
               "sample: workspace of {} B, needs {} B", workspace_bytes, sample_workspace_bytes(a.rows, a.vocab));
  if (a.history)
    FP4MOE_CHECK(a.prompt_len && a.output_len && a.history_stride >= 0,
                 "sample: history needs prompt_len, output_len and a stride");
}

void bind_decode_state(SampleArgs& a, const DecodeState& s) {
  a.draw_index = s.generated;
  a.done = s.finish;
  a.history = s.history;
  a.history_stride = s.history_stride;
  a.prompt_len = s.prompt_len;
  a.output_len = s.generated;
}

void check_decode_state(const DecodeState& s) {
  FP4MOE_CHECK(s.rows >= 0 && s.k_steps >= 1, "decode state: rows {} / K {}", s.rows, s.k_steps);
  FP4MOE_CHECK(s.page_size >= 1, "decode state: page size {}", s.page_size);
  FP4MOE_CHECK(s.stop_stride >= 0 && s.page_stride >= 1 && s.history_stride >= 0,
               "decode state: strides stop {} page {} history {}", s.stop_stride, s.page_stride, s.history_stride);
  if (s.rows == 0) return;
  FP4MOE_CHECK(s.input_token && s.position && s.kv_slot && s.generated && s.max_new && s.max_position && s.pages &&
                   s.finish && s.finish_step && s.prompt_len && s.page_table && s.history && s.out_tokens &&
                   (s.stop_ids || s.stop_stride == 0),
               "decode state: a device array is missing");
}

void decode_advance_cpu(DecodeStateHost& s, const int32_t* tokens, int32_t j) {
  FP4MOE_CHECK(j >= 0 && j < s.k_steps, "decode_advance_cpu: step {} outside 0..{}", j, s.k_steps - 1);
  for (int32_t r = 0; r < s.rows; ++r) {
    const size_t R = size_t(r);
    int32_t& out = s.out_tokens[size_t(j) * size_t(s.rows) + R];
    if (s.finish[R]) {
      out = kNoToken;
      s.kv_slot[R] = s.dead_slot;
      continue;
    }
    const int32_t t = tokens[r];
    out = t;
    const int64_t at = s.prompt_len[R] + s.generated[R];
    if (at < s.history_stride) s.history[size_t(r * s.history_stride + at)] = t;
    s.generated[R] += 1;
    const int32_t pos = s.position[R] + 1;
    bool stop = false;
    for (int32_t q = 0; q < s.stop_stride; ++q) stop |= s.stop_ids[size_t(r * s.stop_stride + q)] == t && t != kNoToken;
    int32_t reason = kRunning;
    if (stop)
      reason = int32_t(FinishReason::kStop);
    else if (s.generated[R] >= s.max_new[R] || pos + 1 >= s.max_position[R])
      reason = int32_t(FinishReason::kLength);
    else if (at >= s.history_stride)
      reason = int32_t(FinishReason::kNoHistory);
    else if (pos / s.page_size >= s.pages[R])
      reason = int32_t(FinishReason::kNoPage);
    if (reason) {
      s.finish[R] = reason;
      s.finish_step[R] = j;
      s.kv_slot[R] = s.dead_slot;
      continue;
    }
    s.input_token[R] = t;
    s.position[R] = pos;
    s.kv_slot[R] = int64_t(s.page_table[size_t(r * s.page_stride + pos / s.page_size)]) * s.page_size + pos % s.page_size;
  }
}

}  // namespace fp4moe::cuda::sampling
