// GpuRunner::mtp_step: the MTP layer (model.layers.{num_layers}; RunnerOptions::mtp) on the
// device — model/'s mtp_forward with the CUDA op set over the runner's workspace, eager.
//
// Workspace use (the step's own buffers, no extra memory): the input states h_in (BF16) are
// uploaded into s.o; the embedding e (FP32) goes to s.x; [enorm(e) | hnorm(h_in)] (BF16
// [T, 2·hidden], the same bytes as FP32 [T, hidden]) to s.of; eh_proj writes the block's residual
// into s.x (e is dead by then); the block runs over s.x / s.h / s.o as a target layer does (its
// MoE output s.of: [e | h] is dead by then); its output states stay in s.h (the head gathers from
// it and nothing writes it after), read back after the forward.
// Draft steps (one token per request at the end of its context) within the decode buckets replay
// a captured graph of the MTP layer (mtp_graphs: captured with the decode graphs), or run eager
// over the same padded batch (graphs disabled): bit for bit the same; other MTP steps (the
// catch-up over a step's pairs) run eager.
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

void GpuRunner::Impl::forward_mtp(int T, int R, int rows, int max_ctx, bool decode) {
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
  v.h_out = nullptr;  // (a read would synchronise: run_mtp copies s.h back after the forward)
  model::mtp_forward(ops, c, mtp->indexer, mtp->block.is_moe, v);
}

void GpuRunner::Impl::run_mtp(const MtpStepInput& in, const MtpStepOutput& out) {
  FP4MOE_CHECK(mtp, "mtp_step: the runner was loaded without the MTP layer (RunnerOptions::mtp)");
  const KvBatchView& b = in.batch;
  const int64_t T = b.num_tokens, R = b.num_requests, H = cfg.hidden, rows = int64_t(in.logits_rows.size());
  FP4MOE_CHECK(T >= 1 && R >= 1, "mtp_step: empty batch ({} tokens, {} requests)", T, R);
  FP4MOE_CHECK(in.h_in, "mtp_step: no input hidden states");
  bool one_each = T == R && b.qo_indptr && b.positions && b.kv_len;  // a draft step: one token per request, its last
  for (int64_t r = 0; one_each && r < R; ++r)
    one_each = b.qo_indptr[r] == r && b.qo_indptr[r + 1] == r + 1 && b.positions[r] == b.kv_len[r] - 1;
  bool every_row = rows == T;
  for (int64_t i = 0; every_row && i < rows; ++i) every_row = in.logits_rows[size_t(i)] == i;
  const GraphEntry* g = nullptr;  // the draft bucket (padded batch; replayed when graphs are on)
  if (one_each && every_row && !mtp_graphs.empty()) {
    auto it = mtp_graphs.lower_bound(T);
    if (it != mtp_graphs.end()) g = &it->second;
  }
  const int64_t pad = g ? g->bucket : 0, Tp = std::max(T, pad);
  StepInput si;
  si.tokens = in.tokens;
  si.batch = b;
  si.logits_rows = in.logits_rows;
  upload_meta(si, pad);  // validates the batch, the tokens, the rows
  clear_token_masks();  // the head's mask launch: every row unconstrained
  poison_activations();
  h_stage.assign(size_t(Tp * H), 0);  // padding rows' inputs: zeros
  for (size_t i = 0; i < size_t(T * H); ++i) h_stage[i] = to_bf16(in.h_in[i]);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.o, h_stage.data(), h_stage.size() * 2, cudaMemcpyHostToDevice, stream));
  if (g && graphs_enabled) {
    FP4MOE_CUDA_CHECK(cudaGraphLaunch(g->exec, stream));
    ++stats.graph_steps;
  } else {
    int max_ctx = 1;
    for (int64_t t = 0; t < T; ++t) max_ctx = std::max(max_ctx, b.positions[t] + 1);
    if (g) max_ctx = int(opt.max_context);  // as captured
    host_batch = pad > 0 ? nullptr : &b;  // unpadded: the host batch is the device one
    try {
      forward_mtp(int(Tp), int(R + (Tp - T)), g ? int(Tp) : int(rows), max_ctx, one_each);
    } catch (...) {
      host_batch = nullptr;
      throw;
    }
    host_batch = nullptr;
    ++stats.eager_steps;
  }
  if (out.logits && rows > 0) {
    out.logits->resize(size_t(rows * cfg.vocab));
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(out.logits->data(), s.logits, out.logits->size() * 4, cudaMemcpyDeviceToHost, stream));
  }
  if (out.hidden)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h_stage.data(), s.h, size_t(T * H) * 2, cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (out.hidden) {
    out.hidden->resize(size_t(T * H));
    for (size_t i = 0; i < out.hidden->size(); ++i) {
      const uint32_t u = uint32_t(h_stage[i]) << 16;
      std::memcpy(&(*out.hidden)[i], &u, 4);
    }
  }
}

void GpuRunner::Impl::capture_mtp_graphs(const std::vector<int64_t>& buckets) {
  if (!mtp) return;
  for (int64_t B : buckets) {
    StepInput none;
    upload_meta(none, B);  // B dummy requests on the trash page
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(s.o, 0, size_t(B * cfg.hidden) * 2, stream));
    mtp_graphs[B] = capture_bucket(B, [&] { forward_mtp(int(B), int(B), int(B), int(opt.max_context), true); });
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
