// The GPU runner's two steps of a speculative round (model/speculative.hpp's SpecSteps), so that
// MtpSpeculator's round — drafts, the draws, acceptance, stop / max_new cuts, the MTP layer over
// the emitted pairs — is the CPU backend's, step for step:
//   - verify: the target over [t_start, d_1 .. d_n] of every request as ONE decode step of
//     R·(n+1) rows, row k of a request a request of its own at position start + k with kv_len
//     start + k + 1 over the same pages (the first ⌈kv_len / page_size⌉). Why a decode step and
//     not the chunked-prefill path: every row then runs the kernels (and, within a graph bucket,
//     the captured graph) of a one-token decode step, so its logits are the plain decode's but
//     for the GEMMs' row count; the rows' cache writes (kv_append before attention in every layer)
//     give row k the keys of rows < k. The runner must allow R·(n+1) requests per step
//     (CudaModelBackend sizes it).
//   - mtp: GpuRunner::mtp_step (draft steps replay the MTP layer's graph of their bucket; the
//     catch-up over a prefill step's pairs runs eager); a round's catch-up runs over every verify
//     row as decode rows (catchup_over_verify_rows: the MTP graph of its bucket), the device
//     round's form.
// Logits come back to the host in full (FP32 [rows, vocab]) for the host sampler: correct for
// every request kind. A batch of greedy requests (model::device_round_eligible) instead runs
// greedy_round: the whole round on the device (GpuRunner::spec_round_greedy, gpu_spec_round.cpp),
// one readback of the emitted tokens and the next MTP state.
#pragma once

#include <vector>

#include "backend/cuda/gpu_runner.hpp"
#include "backend/decode_rows.hpp"
#include "model/speculative.hpp"

namespace fp4moe::engine::gpu {

class GpuSpecSteps final : public model::SpecSteps {
 public:
  explicit GpuSpecSteps(GpuRunner& runner);
  const model::MlaModelConfig& config() const override { return runner_.config(); }
  int64_t page_size() const override { return runner_.page_size(); }
  void verify(const TensorView& tokens, const KvBatchView& b, const std::vector<int32_t>& rows,
              const TensorView& logits, float* hidden) override;
  void mtp(const TensorView& tokens, const float* h_in, const KvBatchView& b, const std::vector<int32_t>& rows,
           const TensorView& logits, float* h_out) override;
  // The round on the device (GpuRunner::spec_round_greedy), unless device_rounds is off.
  bool offers_greedy_round() const override { return device_rounds; }
  // The host round's catch-up in the device round's form (decode rows, every row's logits): host
  // and device rounds then compute the same bits.
  bool offers_catchup_over_verify_rows() const override { return true; }
  bool catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                const TensorView& logits, float* h_out) override;
  bool greedy_round(const model::GreedyRoundInput& in, model::GreedyRoundOutput& out) override;
  // The host round reads the runner's read-back buffer in place (no second copy of [rows, vocab]
  // FP32: 158 MB at B 64 with GLM-5's vocabulary and 3 draft steps); a call given a logits view
  // with storage still gets a copy there.
  bool lends_logits() const override { return true; }
  const float* last_logits() const override { return logits_.data(); }
  bool device_rounds = true;
  int64_t device_round_steps = 0;  // rounds run by greedy_round
  double device_round_gpu_ms = 0.0;  // their GPU time (GreedyRoundOutput::device_ms), summed

  // Steps run (bench / logs): verify steps and their rows, MTP steps and their tokens.
  int64_t verify_steps = 0, verify_rows = 0, mtp_steps = 0, mtp_tokens = 0;

 private:
  GpuRunner& runner_;
  std::vector<float> logits_, hidden_;
};

}  // namespace fp4moe::engine::gpu
