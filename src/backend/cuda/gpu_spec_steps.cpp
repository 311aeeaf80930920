#include "backend/cuda/gpu_spec_steps.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace fp4moe::engine::gpu {

GpuSpecSteps::GpuSpecSteps(GpuRunner& runner) : runner_(runner) {
  FP4MOE_CHECK(runner.has_mtp(), "speculative decoding on the GPU: the runner was loaded without the MTP layer");
}

void GpuSpecSteps::verify(const TensorView& tokens, const KvBatchView& b, const std::vector<int32_t>& rows,
                          const TensorView& logits, float* hidden) {
  const int64_t T = b.num_tokens, V = runner_.config().vocab, H = runner_.config().hidden;
  FP4MOE_CHECK(int64_t(rows.size()) == T, "gpu verify: {} logits rows for {} tokens (every row is asked for)",
               rows.size(), T);
  for (int64_t i = 0; i < T; ++i) FP4MOE_CHECK(rows[size_t(i)] == i, "gpu verify: logits row {} is {}", i, rows[size_t(i)]);
  const DecodeRows d = decode_rows(b, runner_.page_size());
  StepInput in;
  in.tokens = tokens.ptr<const int32_t>();
  in.batch = d.view(b);
  in.logits_rows = rows;
  StepOutput out;
  out.logits = &logits_;
  out.final_hidden = &hidden_;
  runner_.step(in, out);
  if (logits.data) std::memcpy(logits.ptr<float>(), logits_.data(), size_t(T * V) * 4);  // else lent (last_logits)
  std::memcpy(hidden, hidden_.data(), size_t(T * H) * 4);
  ++verify_steps;
  verify_rows += T;
}

void GpuSpecSteps::mtp(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                       const std::vector<int32_t>& rows, const TensorView& logits, float* h_out) {
  const int64_t T = b.num_tokens, V = runner_.config().vocab, H = runner_.config().hidden;
  MtpStepInput in;
  in.tokens = tokens.ptr<const int32_t>();
  in.h_in = h_in;
  in.batch = b;
  in.logits_rows = rows;
  MtpStepOutput out;
  out.logits = rows.empty() ? nullptr : &logits_;
  out.hidden = h_out ? &hidden_ : nullptr;
  runner_.mtp_step(in, out);
  if (!rows.empty() && logits.data) std::memcpy(logits.ptr<float>(), logits_.data(), rows.size() * size_t(V) * 4);
  if (h_out) std::memcpy(h_out, hidden_.data(), size_t(T * H) * 4);
  ++mtp_steps;
  mtp_tokens += T;
}

bool GpuSpecSteps::catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                            const TensorView& logits, float* h_out) {
  const int64_t T = b.num_tokens, V = runner_.config().vocab, H = runner_.config().hidden;
  const DecodeRows d = decode_rows(b, runner_.page_size());
  MtpStepInput in;
  in.tokens = tokens.ptr<const int32_t>();
  in.h_in = h_in;
  in.batch = d.view(b);
  in.logits_rows.resize(size_t(T));
  for (int64_t i = 0; i < T; ++i) in.logits_rows[size_t(i)] = int32_t(i);
  MtpStepOutput out;
  out.logits = &logits_;
  out.hidden = &hidden_;
  runner_.mtp_step(in, out);  // one token per request, every row: the MTP graph of its bucket
  if (logits.data) std::memcpy(logits.ptr<float>(), logits_.data(), size_t(T * V) * 4);
  std::memcpy(h_out, hidden_.data(), size_t(T * H) * 4);
  ++mtp_steps;
  mtp_tokens += T;
  return true;
}

bool GpuSpecSteps::greedy_round(const model::GreedyRoundInput& in, model::GreedyRoundOutput& out) {
  if (!device_rounds) return false;
  runner_.spec_round_greedy(in, out);
  ++device_round_steps;
  device_round_gpu_ms += out.device_ms;
  return true;
}

}  // namespace fp4moe::engine::gpu
