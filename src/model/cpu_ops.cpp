// The CPU op set (model/cpu_ops.hpp): everything but attention (cpu_ops_attention.cpp).
#include "model/cpu_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "cpu/linear_cpu.hpp"
#include "cpu/moe_cpu.hpp"

namespace fp4moe::model {
namespace {

// "" when v is a host FP32 view of `rows` rows of `cols` contiguous values (rows may be strided).
std::string host_rows(const TensorView& v, const char* what, int64_t rows, int64_t cols) {
  if (v.device != Device::Host || v.dtype != DType::F32 || v.ndim != 2 || v.size(0) != rows || v.size(1) != cols ||
      v.strides[1] != 1 || v.strides[0] < cols)
    return fmt::format("the CPU op set takes {} as F32[{}, {}] host rows, got {}", what, rows, cols, v.describe());
  return {};
}

std::string first_of(std::initializer_list<std::string> reasons) {
  for (const std::string& r : reasons)
    if (!r.empty()) return r;
  return {};
}

}  // namespace

CpuOps::CpuOps(const MlaModelConfig& c, const ModelWeights& w, const ModelOptions& opt, Arena& arena, HostKvPool& kv,
               const KvBatchView& batch, AttentionForm form)
    : cfg_(c), w_(w), opt_(opt), arena_(arena), kv_(kv), batch_(batch), form_(form) {}

int CpuOps::threads() const { return opt_.threads > 0 ? opt_.threads : default_num_threads(); }

const LayerWeights& CpuOps::layer_weights(const LayerRef& ref) const {
  if (ref.mtp) {
    FP4MOE_CHECK(!w_.mtp.empty(), "the checkpoint has no MTP layer (model.layers.{}.*)", cfg_.num_layers);
    return w_.mtp[0].layer;
  }
  FP4MOE_CHECK(ref.layer >= 0 && ref.layer < int64_t(w_.layers.size()), "layer {} of {}", ref.layer, w_.layers.size());
  return w_.layers[size_t(ref.layer)];
}

void CpuOps::begin_step() {
  const MlaModelConfig& c = cfg_;
  const KvBatchView& b = batch_;
  const int64_t T = b.num_tokens;
  arena_.reset();
  // Rows with at most topk_k causal keys select them all, so k beyond the longest request
  // changes nothing; this bounds the selection buffer.
  int64_t longest = 1;
  for (int64_t r = 0; r < b.num_requests; ++r) longest = std::max<int64_t>(longest, b.kv_len[r]);
  s_.topk_k = std::min<int64_t>(c.index_topk, longest);
  s_.topk = c.has_indexer() ? arena_.alloc<int32_t>(size_t(std::max<int64_t>(T * c.index_topk, 1))) : nullptr;
  s_.have_topk = false;
  s_.cos = arena_.alloc<float>(size_t(T * c.qk_rope_dim / 2 + 1));
  s_.sin = arena_.alloc<float>(size_t(T * c.qk_rope_dim / 2 + 1));
  for (int64_t t = 0; t < T; ++t)
    rope_cos_sin(c.rope, b.positions[t], s_.cos + t * (c.qk_rope_dim / 2), s_.sin + t * (c.qk_rope_dim / 2));
}

// ---- can_implement ----

std::string CpuOps::can_implement(const EmbedArgs& a) const {
  const int64_t T = batch_.num_tokens;
  if (a.tokens.device != Device::Host || a.tokens.dtype != DType::I32 || a.tokens.ndim != 1 || a.tokens.size(0) != T ||
      !a.tokens.is_contiguous())
    return fmt::format("the CPU op set takes tokens as I32[{}] host, got {}", T, a.tokens.describe());
  if (a.table == Table::Mtp && w_.mtp.empty()) return "the checkpoint has no MTP layer";
  return first_of({host_rows(a.x, "the embeddings", T, cfg_.hidden),
                   a.x.is_contiguous() ? "" : "the CPU op set writes embeddings into contiguous rows"});
}

std::string CpuOps::can_implement(const RmsNormArgs& a) const {
  const int64_t T = batch_.num_tokens;
  const bool mtp = a.role == NormRole::MtpEmbed || a.role == NormRole::MtpHidden || a.role == NormRole::MtpSharedHead ||
                   ((a.role == NormRole::Input || a.role == NormRole::PostAttention) && a.ref.mtp);
  if (mtp && w_.mtp.empty()) return "the checkpoint has no MTP layer";
  if ((a.role == NormRole::Input || a.role == NormRole::PostAttention) && !a.ref.mtp &&
      (a.ref.layer < 0 || a.ref.layer >= int64_t(w_.layers.size())))
    return fmt::format("norm of layer {}: the model has {} layers", a.ref.layer, w_.layers.size());
  return first_of(
      {host_rows(a.x, "a norm's input", T, cfg_.hidden), host_rows(a.y, "a norm's output", T, cfg_.hidden)});
}

std::string CpuOps::can_implement(const AttentionArgs& a) const {
  const int64_t T = batch_.num_tokens;
  if (a.ref.mtp && w_.mtp.empty()) return "the checkpoint has no MTP layer";
  if (!a.ref.mtp && (a.ref.layer < 0 || a.ref.layer >= int64_t(w_.layers.size())))
    return fmt::format("attention of layer {}: the model has {} layers", a.ref.layer, w_.layers.size());
  if (a.ref.layer >= kv_.geometry().num_layers)
    return fmt::format("attention of layer {}: the KV pool has {} layers", a.ref.layer, kv_.geometry().num_layers);
  return first_of({host_rows(a.h, "attention's input", T, cfg_.hidden),
                   host_rows(a.out, "attention's output", T, cfg_.hidden),
                   a.h.is_contiguous() && a.out.is_contiguous() ? "" : "the CPU attention op takes contiguous rows"});
}

std::string CpuOps::can_implement(const AddArgs& a) const {
  const int64_t T = batch_.num_tokens;
  return first_of({host_rows(a.x, "the residual", T, cfg_.hidden), host_rows(a.o, "an addend", T, cfg_.hidden),
                   a.x.is_contiguous() && a.o.is_contiguous() ? "" : "the CPU add takes contiguous rows"});
}

std::string CpuOps::can_implement(const FfnArgs& a) const {
  const int64_t T = batch_.num_tokens;
  if (a.ref.mtp && w_.mtp.empty()) return "the checkpoint has no MTP layer";
  if (!a.ref.mtp && (a.ref.layer < 0 || a.ref.layer >= int64_t(w_.layers.size())))
    return fmt::format("FFN of layer {}: the model has {} layers", a.ref.layer, w_.layers.size());
  if (a.moe != layer_weights(a.ref).is_moe)
    return fmt::format("layer {} is {}, the FFN op was asked for {}", a.ref.layer,
                       layer_weights(a.ref).is_moe ? "MoE" : "dense", a.moe ? "MoE" : "dense");
  return first_of({host_rows(a.h, "the FFN input", T, cfg_.hidden), host_rows(a.o, "the FFN scratch", T, cfg_.hidden),
                   host_rows(a.x, "the residual", T, cfg_.hidden),
                   a.h.is_contiguous() && a.o.is_contiguous() && a.x.is_contiguous()
                       ? ""
                       : "the CPU FFN op takes contiguous rows"});
}

std::string CpuOps::can_implement(const LinearArgs& a) const {
  const int64_t T = batch_.num_tokens;
  if (w_.mtp.empty()) return "the checkpoint has no MTP layer (eh_proj)";
  return first_of({host_rows(a.x, "eh_proj's input", T, 2 * cfg_.hidden),
                   host_rows(a.y, "eh_proj's output", T, cfg_.hidden),
                   a.x.is_contiguous() && a.y.is_contiguous() ? "" : "the CPU linear takes contiguous rows"});
}

std::string CpuOps::can_implement(const HeadArgs& a) const {
  const int64_t T = batch_.num_tokens;
  if (a.table == Table::Mtp && w_.mtp.empty()) return "the checkpoint has no MTP layer";
  if (a.rows.device != Device::Host || a.rows.dtype != DType::I32 || a.rows.ndim != 1 || !a.rows.is_contiguous())
    return fmt::format("the CPU op set takes logits rows as I32[n] host, got {}", a.rows.describe());
  const int64_t n = a.rows.size(0);
  return first_of({host_rows(a.h, "the head's input", T, cfg_.hidden), host_rows(a.logits, "the logits", n, cfg_.vocab),
                   a.logits.is_contiguous() ? "" : "the CPU head writes contiguous logits"});
}

// ---- run ----

void CpuOps::run(const EmbedArgs& a) {
  const int64_t T = batch_.num_tokens, H = cfg_.hidden;
  const cpu::LinearView& emb = a.table == Table::Mtp && w_.mtp[0].embed ? w_.mtp[0].embed->w : w_.embed.w;
  const int32_t* tokens = a.tokens.ptr<const int32_t>();
  float* x = a.x.ptr<float>();
  for (int64_t t = 0; t < T; ++t) cpu::linear_row_cpu(emb, tokens[t], x + t * H);
}

void CpuOps::run(const RmsNormArgs& a) {
  const NormWeights* w = nullptr;
  switch (a.role) {
    case NormRole::Input: w = &layer_weights(a.ref).input_norm; break;
    case NormRole::PostAttention: w = &layer_weights(a.ref).post_attention_norm; break;
    case NormRole::Final: w = &w_.final_norm; break;
    case NormRole::MtpEmbed: w = &w_.mtp[0].enorm; break;
    case NormRole::MtpHidden: w = &w_.mtp[0].hnorm; break;
    case NormRole::MtpSharedHead: w = &w_.mtp[0].shared_head_norm; break;
  }
  const int64_t H = cfg_.hidden;
  rms_norm_rows(a.x.ptr<const float>(), batch_.num_tokens, H, a.x.strides[0], w->weight.data(),
                float(cfg_.rms_norm_eps), a.y.ptr<float>(), a.y.strides[0]);
}

void CpuOps::run(const AddArgs& a) {
  const int64_t n = batch_.num_tokens * cfg_.hidden;
  float* x = a.x.ptr<float>();
  const float* o = a.o.ptr<const float>();
  for (int64_t i = 0; i < n; ++i) x[i] += o[i];
}

void CpuOps::run(const FfnArgs& a) {
  const LayerWeights& lw = layer_weights(a.ref);
  const int64_t T = batch_.num_tokens, layer = a.ref.layer;
  const float* h = a.h.ptr<const float>();
  float* out = a.o.ptr<float>();
  if (lw.is_moe) {
    CpuMoeOptions o;
    o.threads = threads();
    o.bf16_activations = false;
    if (opt_.hooks.router_logits) o.router_logits = opt_.hooks.router_logits(layer, T);
    const MoeOutput r = moe_forward_cpu(lw.moe, h, T, o);
    if (opt_.hooks.on_routing) opt_.hooks.on_routing(layer, T, r.logits.data(), r.routing.topk_ids.data());
    std::memcpy(out, r.out.data(), r.out.size() * sizeof(float));
    if (opt_.on_moe_routing) {
      std::vector<int32_t> per_expert(size_t(lw.moe.cfg.num_experts), 0);
      for (int32_t e : r.routing.topk_ids) ++per_expert[size_t(e)];
      opt_.on_moe_routing(layer, per_expert);
    }
  } else {
    Arena::Scope scope(arena_);
    const int64_t I = cfg_.intermediate;
    float* g = arena_.alloc<float>(size_t(T * I));
    float* u = arena_.alloc<float>(size_t(T * I));
    cpu::linear_cpu(lw.mlp.gate.w, h, T, g, threads());
    cpu::linear_cpu(lw.mlp.up.w, h, T, u, threads());
    for (int64_t i = 0; i < T * I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    cpu::linear_cpu(lw.mlp.down.w, g, T, out, threads());
  }
  run(AddArgs{a.x, a.o});
}

void CpuOps::run(const LinearArgs& a) {
  cpu::linear_cpu(w_.mtp[0].eh_proj.w, a.x.ptr<const float>(), batch_.num_tokens, a.y.ptr<float>(), threads());
}

void CpuOps::run(const HeadArgs& a) {
  const int64_t n = a.rows.size(0), H = cfg_.hidden;
  if (n == 0) return;
  const cpu::LinearView& head = a.table == Table::Mtp && w_.mtp[0].head ? w_.mtp[0].head->w : w_.lm_head.w;
  const int32_t* rows_idx = a.rows.ptr<const int32_t>();
  const float* h = a.h.ptr<const float>();
  float* rows = arena_.alloc<float>(size_t(n * H));
  for (int64_t i = 0; i < n; ++i) {
    FP4MOE_CHECK(rows_idx[i] >= 0 && rows_idx[i] < batch_.num_tokens, "logits row {} of a step of {} tokens",
                 rows_idx[i], batch_.num_tokens);
    std::memcpy(rows + i * H, h + int64_t(rows_idx[i]) * a.h.strides[0], size_t(H) * sizeof(float));
  }
  const auto t0 = std::chrono::steady_clock::now();
  cpu::linear_cpu(head, rows, n, a.logits.ptr<float>(), threads());
  if (log_level() <= LogLevel::Debug)
    log_debug("lm_head ({} rows) {:.2f} ms", n,
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void CpuOps::read(const TensorView& src, float* dst) {
  FP4MOE_CHECK(src.device == Device::Host && src.dtype == DType::F32 && src.ndim == 2 && src.strides[1] == 1,
               "the CPU op set reads F32 host rows, got {}", src.describe());
  const float* p = src.ptr<const float>();
  for (int64_t r = 0; r < src.size(0); ++r)
    std::memcpy(dst + r * src.size(1), p + r * src.strides[0], size_t(src.size(1)) * sizeof(float));
}

void CpuOps::mark(Stage stage, int64_t layer) {
  if (log_level() > LogLevel::Debug) return;
  const auto now = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  if (stage == Stage::Moe || stage == Stage::Dense) {
    block_t1_ = now;
    block_moe_ = stage == Stage::Moe;
    return;
  }
  if (block_layer_ >= 0)
    log_debug("step of {} tokens: layer {}: attention {:.2f} ms, {} {:.2f} ms", batch_.num_tokens, block_layer_,
              ms(block_t0_, block_t1_), block_moe_ ? "moe" : "mlp", ms(block_t1_, now));
  block_layer_ = stage == Stage::Attention ? layer : -1;
  block_t0_ = now;
}

}  // namespace fp4moe::model
