// GpuRunner::mtp_step: the MTP layer (model.layers.{num_layers}; RunnerOptions::mtp) on the
// device — model/'s mtp_forward with the CUDA op set over the runner's workspace, eager.
//
// Workspace use (the step's own buffers, no extra memory): the input states h_in (BF16) are
// uploaded into s.o; the embedding e (FP32) goes to s.x; [enorm(e) | hnorm(h_in)] (BF16
// [T, 2·hidden], the same bytes as FP32 [T, hidden]) to s.of; eh_proj writes the block's residual
// into s.x (e is dead by then); the block runs over s.x / s.h / s.o as a target layer does (its
// MoE output s.of: [e | h] is dead by then).
#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "backend/cuda/cuda_ops.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"
#include "model/layer_stack.hpp"

namespace fp4moe::engine::gpu {
namespace {

// FP32 → BF16 bits, round to nearest even (NaN kept a NaN).
uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace

void GpuRunner::Impl::forward_mtp(int T, int R, int rows, int max_ctx, bool decode, float* h_out) {
  const model::MlaModelConfig& c = cfg;
  const int64_t H = c.hidden;
  plan_prefill(T, decode);
  CudaOps ops(*this, T, R, max_ctx, decode, nullptr);
  model::MtpViews v;
  v.tokens = TensorView::of(meta.tokens, {T}, Device::Cuda);
  v.h_in = TensorView::contiguous(s.o, DType::BF16, {T, H}, Device::Cuda);
  v.eg = TensorView::contiguous(s.of, DType::BF16, {T, 2 * H}, Device::Cuda);
  v.e = TensorView::of(s.x, {T, H}, Device::Cuda);
  v.x = TensorView::of(s.x, {T, H}, Device::Cuda);
  v.h = TensorView::contiguous(s.h, DType::BF16, {T, H}, Device::Cuda);
  v.o = TensorView::contiguous(s.o, DType::BF16, {T, H}, Device::Cuda);
  v.rows = TensorView::of(meta.rows, {rows}, Device::Cuda);
  v.logits = TensorView::of(s.logits, {rows, c.vocab}, Device::Cuda);
  v.h_out = h_out;
  model::mtp_forward(ops, c, mtp->indexer, mtp->block.is_moe, v);
}

void GpuRunner::Impl::run_mtp(const MtpStepInput& in, const MtpStepOutput& out) {
  FP4MOE_CHECK(mtp, "mtp_step: the runner was loaded without the MTP layer (RunnerOptions::mtp)");
  const KvBatchView& b = in.batch;
  const int64_t T = b.num_tokens, R = b.num_requests, H = cfg.hidden, rows = int64_t(in.logits_rows.size());
  FP4MOE_CHECK(T >= 1 && R >= 1, "mtp_step: empty batch ({} tokens, {} requests)", T, R);
  FP4MOE_CHECK(in.h_in, "mtp_step: no input hidden states");
  StepInput si;
  si.tokens = in.tokens;
  si.batch = b;
  si.logits_rows = in.logits_rows;
  upload_meta(si, 0);  // validates the batch, the tokens, the rows
  clear_token_masks();  // the head's mask launch: every row unconstrained
  poison_activations();
  h_stage.resize(size_t(T * H));
  for (size_t i = 0; i < h_stage.size(); ++i) h_stage[i] = to_bf16(in.h_in[i]);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.o, h_stage.data(), h_stage.size() * 2, cudaMemcpyHostToDevice, stream));
  bool one_each = T == R;  // draft steps: one token per request, the last of its context
  for (int64_t r = 0; one_each && r < R; ++r)
    one_each = b.qo_indptr[r] == r && b.qo_indptr[r + 1] == r + 1 && b.positions[r] == b.kv_len[r] - 1;
  int max_ctx = 1;
  for (int64_t t = 0; t < T; ++t) max_ctx = std::max(max_ctx, b.positions[t] + 1);
  if (out.hidden) out.hidden->resize(size_t(T * H));
  host_batch = &b;
  try {
    forward_mtp(int(T), int(R), int(rows), max_ctx, one_each, out.hidden ? out.hidden->data() : nullptr);
  } catch (...) {
    host_batch = nullptr;
    throw;
  }
  host_batch = nullptr;
  ++stats.eager_steps;
  if (out.logits && rows > 0) {
    out.logits->resize(size_t(rows * cfg.vocab));
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(out.logits->data(), s.logits, out.logits->size() * 4, cudaMemcpyDeviceToHost, stream));
  }
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void GpuRunner::mtp_step(const MtpStepInput& in, const MtpStepOutput& out) {
  try {
    impl_->run_mtp(in, out);
  } catch (const cuda::OutOfMemory&) {
    impl_->rethrow_out_of_memory("running an MTP step");
  }
}

}  // namespace fp4moe::engine::gpu
