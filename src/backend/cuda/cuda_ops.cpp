// The CUDA op set (backend/cuda/cuda_ops.hpp): everything but attention (cuda_ops_attention.cpp).
#include "backend/cuda/cuda_ops.hpp"

#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::engine::gpu {
namespace {

const char* kNoMtp =
    "the CUDA op set has no MTP layer: the GPU runner was loaded without it (RunnerOptions::mtp; "
    "model.layers.{num_layers})";

// "" when v is a BF16 cuda view of rows x cols with unit column stride (rows may be strided).
std::string bf16_rows(const TensorView& v, int64_t rows, int64_t cols, const char* what) {
  if (v.device != Device::Cuda || v.dtype != DType::BF16 || v.ndim != 2 || v.size(0) != rows || v.size(1) != cols ||
      v.strides[1] != 1)
    return fmt::format("the CUDA op set takes {} as BF16[{}, {}] cuda (rows may be strided), got {}", what, rows, cols,
                       v.describe());
  return {};
}

}  // namespace

CudaOps::CudaOps(GpuRunner::Impl& m, int T, int R, int max_ctx, bool decode, StepChoices* choices)
    : m_(m), T_(T), R_(R), max_ctx_(max_ctx), decode_(decode), choices_(choices) {}

std::string CudaOps::activation(const TensorView& v, const char* what, DType dt) const {
  const int64_t H = m_.cfg.hidden;
  if (v.device != Device::Cuda || v.dtype != dt || v.ndim != 2 || v.size(0) != T_ || v.size(1) != H ||
      !v.is_contiguous())
    return fmt::format("the CUDA op set takes {} as {}[{}, {}] cuda, got {}", what, dtype_name(dt), T_, H,
                       v.describe());
  return {};
}

// ---- can_implement ----

std::string CudaOps::can_implement(const model::EmbedArgs& a) const {
  if (a.table != model::Table::Target && !m_.mtp) return kNoMtp;
  if (a.tokens.device != Device::Cuda || a.tokens.dtype != DType::I32 || a.tokens.ndim != 1 || a.tokens.size(0) != T_)
    return fmt::format("the CUDA op set takes tokens as I32[{}] cuda, got {}", T_, a.tokens.describe());
  return activation(a.x, "the embeddings", DType::F32);
}

std::string CudaOps::can_implement(const model::RmsNormArgs& a) const {
  using model::NormRole;
  const bool mtp_role = a.role == NormRole::MtpEmbed || a.role == NormRole::MtpHidden || a.role == NormRole::MtpSharedHead;
  if ((a.ref.mtp || mtp_role) && !m_.mtp) return kNoMtp;
  if (a.role == NormRole::MtpEmbed || a.role == NormRole::MtpHidden) {
    // [enorm(e) | hnorm(h)]: into a column half of eh_proj's input; hnorm's input h is the
    // target's final-norm state as the runner keeps it (BF16).
    const int64_t H = m_.cfg.hidden;
    std::string why = a.role == NormRole::MtpEmbed ? activation(a.x, "the MTP embedding", DType::F32)
                                                   : activation(a.x, "the MTP input state", DType::BF16);
    if (!why.empty()) return why;
    return bf16_rows(a.y, T_, H, "an MTP norm's output");
  }
  if (!a.ref.mtp && a.role != NormRole::Final && a.role != NormRole::MtpSharedHead &&
      (a.ref.layer < 0 || a.ref.layer >= int64_t(m_.layers.size())))
    return fmt::format("norm of layer {}: the runner has {} layers", a.ref.layer, m_.layers.size());
  if (std::string why = activation(a.x, "a norm's input", DType::F32); !why.empty()) return why;
  return activation(a.y, "a norm's output", DType::BF16);
}

std::string CudaOps::can_implement(const model::AttentionArgs& a) const {
  if (a.ref.mtp && !m_.mtp) return kNoMtp;
  if (a.ref.mtp && a.indexer != m_.mtp->indexer)
    return fmt::format("the MTP layer's attention was asked with indexer kind {}, its weights have {}", int(a.indexer),
                       int(m_.mtp->indexer));
  if (!a.ref.mtp && (a.ref.layer < 0 || a.ref.layer >= int64_t(m_.layers.size())))
    return fmt::format("attention of layer {}: the runner has {} layers", a.ref.layer, m_.layers.size());
  if (std::string why = activation(a.h, "attention's input", DType::BF16); !why.empty()) return why;
  return activation(a.out, "attention's output", DType::BF16);
}

std::string CudaOps::can_implement(const model::AddArgs& a) const {
  if (std::string why = activation(a.x, "the residual", DType::F32); !why.empty()) return why;
  return activation(a.o, "an addend", DType::BF16);
}

std::string CudaOps::can_implement(const model::FfnArgs& a) const {
  if (a.ref.mtp && !m_.mtp) return kNoMtp;
  if (!a.ref.mtp && (a.ref.layer < 0 || a.ref.layer >= int64_t(m_.layers.size())))
    return fmt::format("FFN of layer {}: the runner has {} layers", a.ref.layer, m_.layers.size());
  if (a.moe != m_.layer(a.ref).is_moe)
    return fmt::format("layer {} is {}, the FFN op was asked for {}", a.ref.layer,
                       m_.layer(a.ref).is_moe ? "MoE" : "dense", a.moe ? "MoE" : "dense");
  if (std::string why = activation(a.h, "the FFN input", DType::BF16); !why.empty()) return why;
  if (std::string why = activation(a.o, "the FFN scratch", DType::BF16); !why.empty()) return why;
  return activation(a.x, "the residual", DType::F32);
}

std::string CudaOps::can_implement(const model::LinearArgs& a) const {
  if (!m_.mtp) return kNoMtp;
  if (a.role != model::LinearRole::MtpEhProj) return fmt::format("linear role {}: not the CUDA op set's", int(a.role));
  const int64_t H = m_.cfg.hidden;
  if (a.x.device != Device::Cuda || a.x.dtype != DType::BF16 || a.x.ndim != 2 || a.x.size(0) != T_ ||
      a.x.size(1) != 2 * H || !a.x.is_contiguous())
    return fmt::format("the CUDA op set takes eh_proj's input as BF16[{}, {}] cuda, got {}", T_, 2 * H, a.x.describe());
  return activation(a.y, "eh_proj's output (the MTP block's residual)", DType::F32);
}

std::string CudaOps::can_implement(const model::HeadArgs& a) const {
  if (a.table != model::Table::Target && !m_.mtp) return kNoMtp;
  if (std::string why = activation(a.h, "the head's input", DType::BF16); !why.empty()) return why;
  if (a.rows.device != Device::Cuda || a.rows.dtype != DType::I32 || a.rows.ndim != 1)
    return fmt::format("the CUDA op set takes logits rows as I32[n] cuda, got {}", a.rows.describe());
  const int64_t n = a.rows.size(0);
  if (n > m_.logits_rows) return fmt::format("{} logits rows: the runner was planned for {}", n, m_.logits_rows);
  if (a.logits.data != m_.s.logits || a.logits.dtype != DType::F32 || a.logits.ndim != 2 || a.logits.size(0) != n ||
      a.logits.size(1) != m_.cfg.vocab)
    return fmt::format("the CUDA head writes the runner's logits F32[{}, {}], got {}", n, m_.cfg.vocab,
                       a.logits.describe());
  return {};
}

// ---- run ----

void CudaOps::run(const model::EmbedArgs& a) {
  const bool own = a.table == model::Table::Mtp && m_.mtp->embed.bytes() > 0;  // the MTP layer's own table
  embed_rows(own ? m_.mtp->embed.ptr() : m_.embed.ptr(), false, a.tokens.ptr<const int32_t>(), T_, int(m_.cfg.hidden),
             a.x.ptr<float>(), m_.stream);
}

void CudaOps::run(const model::RmsNormArgs& a) {
  using model::NormRole;
  const int H = int(m_.cfg.hidden);
  const float eps = float(m_.cfg.rms_norm_eps);
  const DeviceNorm* w = nullptr;
  switch (a.role) {
    case NormRole::Final: w = &m_.final_norm; break;
    case NormRole::Input: w = &m_.layer(a.ref).input_norm; break;
    case NormRole::PostAttention: w = &m_.layer(a.ref).post_norm; break;
    case NormRole::MtpEmbed: w = &m_.mtp->enorm; break;
    case NormRole::MtpHidden: w = &m_.mtp->hnorm; break;
    case NormRole::MtpSharedHead: w = &m_.mtp->head_norm; break;
  }
  const int64_t y_stride = a.y.strides[0];
  if (a.x.dtype == DType::BF16) {  // hnorm over the target's BF16 state
    rms_norm(bf16_bits(a.x), H, T_, H, w->wp(), eps, bf16_bits(a.y), y_stride, m_.stream);
    return;
  }
  rms_norm(a.x.ptr<const float>(), H, T_, H, w->wp(), eps, bf16_bits(a.y), y_stride, m_.stream);
}

void CudaOps::run(const model::AddArgs& a) {
  add_into(a.x.ptr<float>(), bf16_bits(a.o), int64_t(T_) * m_.cfg.hidden, m_.stream);
}

void CudaOps::dense_mlp(const DenseMlp& mlp, const uint16_t* h, uint16_t* out) {
  Scratch& s = m_.s;
  const LinearCtx x = m_.lctx();
  const int T = T_;
  mlp.gate.run(h, T, s.g, false, x);
  mlp.up.run(h, T, s.u, false, x);
  silu_mul(s.g, mlp.inter, s.u, mlp.inter, s.hm, T, int(mlp.inter), m_.stream);
  mlp.down.run(s.hm, T, out, false, x);
}

void CudaOps::run(const model::FfnArgs& a) {
  GpuRunner::Impl& m = m_;
  Scratch& s = m.s;
  const cudaStream_t stream = m.stream;
  const int64_t l = a.ref.layer;
  const int T = T_;
  const DeviceLayer& L = m.layer(a.ref);
  const bool counted = !a.ref.mtp;  // the MTP layer's routing is not a target layer's (no count row)
  const int64_t H = m.cfg.hidden;
  const uint16_t* h = bf16_bits(a.h);
  uint16_t* o = bf16_bits(a.o);
  float* resid = a.x.ptr<float>();
  if (!L.is_moe) {
    dense_mlp(L.mlp, h, o);
    add_into(resid, o, int64_t(T) * H, stream);
    return;
  }
  if (L.moe) {
    const MoeWorkspace ws{s.moe_ws, s.moe_ws_bytes};
    L.moe->forward(h, T, s.of, ws, stream);
    const MoeRoutingView v = L.moe->routing(ws, T);
    const MoeConfig& mc = L.moe->config();
    if (counted) count_layer(l, v.topk_ids, int(mc.top_k));
    if (choices_ && counted) {
      choices_->router_logits[size_t(l)] = download(v.logits, size_t(T * mc.num_experts), stream);
      choices_->expert_ids[size_t(l)] = download(v.topk_ids, size_t(T * mc.top_k), stream);
    }
  } else {
    const DenseExperts& d = *L.dense_experts;
    const int E = d.router.num_experts, k = d.router.top_k, I = int(m.cfg.moe.inter);
    cuda::route(d.router, h, d.router_w.as<float>(), d.router_bias.as<float>(), T, int(H), s.rlogits, s.rids, s.rw,
                cuda::RouterWorkspace{s.router_ws, s.router_ws_bytes}, stream);
    // gu[e] (2I × T col-major) = W13_e · x; h = SiLU(gate) · up; y[e] (H × T) = W2_e · h_e.
    m.blas.batched(true, 2 * I, T, int(H), d.w13.ptr(), H, int64_t(2) * I * H, h, H, 0, s.gu, false, 2 * I,
                   int64_t(T) * 2 * I, E, stream);
    silu_mul(s.gu, 2 * I, s.gu + I, 2 * I, s.eh, E * T, I, stream);
    m.blas.batched(true, int(H), T, I, d.w2.ptr(), I, H * I, s.eh, I, int64_t(T) * I, s.ey, true, H, int64_t(T) * H, E,
                   stream);
    moe_dense_combine_f32(s.ey, s.rids, s.rw, nullptr, T, k, int(H), s.of, stream);
    if (counted) count_layer(l, s.rids, k);
    if (choices_ && counted) {
      choices_->router_logits[size_t(l)] = download(s.rlogits, size_t(T) * E, stream);
      choices_->expert_ids[size_t(l)] = download(s.rids, size_t(T) * k, stream);
    }
  }
  add_into(resid, s.of, int64_t(T) * H, stream);
  if (L.shared) {
    dense_mlp(*L.shared, h, o);
    add_into(resid, o, int64_t(T) * H, stream);
  }
}

void CudaOps::count_layer(int64_t l, const int32_t* ids, int k) {
  const StepCounters& c = m_.counters;
  if (!m_.opt.count_experts || c.moe_layers == 0) return;
  count_experts(ids, T_, k, m_.meta.token_req, m_.meta.active, int(c.experts),
                c.counts.as<int32_t>() + int64_t(c.moe_slot[size_t(l)]) * c.experts, m_.stream);
}

void CudaOps::run(const model::LinearArgs& a) {
  m_.mtp->eh_proj.run(bf16_bits(a.x), T_, a.y.ptr<float>(), true, m_.lctx());
}

void CudaOps::run(const model::HeadArgs& a) {
  const int rows = int(a.rows.size(0));
  if (rows == 0) return;
  const int H = int(m_.cfg.hidden);
  gather_rows(bf16_bits(a.h), H, a.rows.ptr<const int32_t>(), rows, m_.s.rows, m_.stream);
  const bool own = a.table == model::Table::Mtp && m_.mtp->head;  // the MTP layer's own head
  (own ? *m_.mtp->head : m_.lm_head).run(m_.s.rows, rows, a.logits.ptr<float>(), true, m_.lctx());
  m_.mark(StepStage::Sampling);
  m_.apply_token_masks(rows);  // grammar masks (rows whose slot is -1 are left alone)
  argmax_rows_f32(a.logits.ptr<float>(), rows, int(m_.cfg.vocab), m_.s.greedy, m_.s.argmax_ws, m_.s.argmax_ws_bytes,
                  m_.stream);
}

void CudaOps::read(const TensorView& src, float* dst) {
  FP4MOE_CHECK(src.device == Device::Cuda && src.is_contiguous() &&
                   (src.dtype == DType::F32 || src.dtype == DType::BF16),
               "the CUDA op set reads contiguous F32 / BF16 device views, got {}", src.describe());
  const size_t n = size_t(src.numel());
  if (src.dtype == DType::F32) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, n * 4, cudaMemcpyDeviceToHost, m_.stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(m_.stream));
    return;
  }
  std::vector<uint16_t> hb(n);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(hb.data(), src.data, n * 2, cudaMemcpyDeviceToHost, m_.stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(m_.stream));
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(hb[i]) << 16;
    std::memcpy(&dst[i], &u, 4);
  }
}

static_assert(int(model::Stage::Embed) == int(StepStage::Embed) &&
                  int(model::Stage::Indexer) == int(StepStage::Indexer) &&
                  int(model::Stage::Moe) == int(StepStage::Moe) && int(model::Stage::Dense) == int(StepStage::Dense) &&
                  int(model::Stage::Sampling) == int(StepStage::Sampling),
              "model::Stage and StepStage name the same stages in the same order");

void CudaOps::mark(model::Stage stage, int64_t) { m_.mark(StepStage(int(stage))); }

}  // namespace fp4moe::engine::gpu
