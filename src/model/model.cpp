#include "model/model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "cpu/linear_cpu.hpp"
#include "cpu/moe_cpu.hpp"
#include "model/step_scratch.hpp"

namespace fp4moe::model {

void rms_norm_rows(const float* x, int64_t rows, int64_t dim, int64_t stride, const float* w, float eps, float* y,
                   int64_t y_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    float* yr = y + r * y_stride;
    float ss = 0.0f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void layer_norm_rows(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float mean = 0.0f;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= float(dim);
    float var = 0.0f;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / std::sqrt(var / float(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
}

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m(new Model());
  m->opt_ = opt;
  m->ck_ = Checkpoint::open(dir);
  m->cfg_ = parse_mla_model_config(m->ck_->config_json(), m->ck_->config(), dir + "/config.json");
  m->w_ = bind_weights(*m->ck_, m->cfg_);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MlaModelConfig& c = m->cfg_;
  int64_t moe = 0, shared = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    moe += c.moe_layer[size_t(l)];
    shared += c.indexer[size_t(l)] == IndexerKind::Shared;
  }
  m->description_ = fmt::format("loaded {} ({}): {} layers ({} MoE, {} shared-indexer), hidden {}, vocab {}, rope {}; {} in {:.2f} s",
                                dir, c.architecture, c.num_layers, moe, shared, c.hidden, c.vocab, c.rope.type,
                                m->w_.summary, s);
  log_debug("{}", m->description_);
  return m;
}

int Model::threads() const { return opt_.threads > 0 ? opt_.threads : default_num_threads(); }

PagedKvGeometry Model::kv_geometry(int64_t page_size, int64_t num_pages, KvElem elem) const {
  PagedKvGeometry g;
  g.num_layers = cfg_.num_layers;
  g.page_size = page_size;
  g.num_pages = num_pages;
  g.ckv_dim = cfg_.kv_lora_rank;
  g.kpe_dim = cfg_.qk_rope_dim;
  g.index_dim = cfg_.has_indexer() ? cfg_.index_head_dim : 0;
  g.elem = g.index_elem = elem;
  return g;
}

std::vector<bool> Model::kv_index_layers() const {
  std::vector<bool> v(size_t(cfg_.num_layers));
  for (int64_t l = 0; l < cfg_.num_layers; ++l) v[size_t(l)] = cfg_.indexer[size_t(l)] == IndexerKind::Full;
  return v;
}

void Model::mlp(int64_t layer, const LayerWeights& lw, const float* h, int64_t T, float* out) {
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
    return;
  }
  Arena::Scope scope(arena_);
  const int64_t I = cfg_.intermediate;
  float* g = arena_.alloc<float>(size_t(T * I));
  float* u = arena_.alloc<float>(size_t(T * I));
  cpu::linear_cpu(lw.mlp.gate.w, h, T, g, threads());
  cpu::linear_cpu(lw.mlp.up.w, h, T, u, threads());
  for (int64_t i = 0; i < T * I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  cpu::linear_cpu(lw.mlp.down.w, g, T, out, threads());
}

void Model::check_step(const TensorView& token_view, const KvBatchView& b, const HostKvPool& kv,
                       const std::vector<int32_t>& logits_rows, const TensorView& logits_view, int64_t kv_layers) {
  const MlaModelConfig& c = cfg_;
  const int64_t T = b.num_tokens;
  FP4MOE_CHECK(token_view.ndim == 1 && token_view.size(0) == T && token_view.is_contiguous() &&
                   token_view.device == Device::Host,
               "step: tokens are {}, expected I32[{}] host", token_view.describe(), T);
  if (!logits_rows.empty())
    FP4MOE_CHECK(logits_view.ndim == 2 && logits_view.size(0) == int64_t(logits_rows.size()) &&
                     logits_view.size(1) == c.vocab && logits_view.is_contiguous() && logits_view.device == Device::Host,
                 "step: logits are {}, expected F32[{}, {}] host", logits_view.describe(), logits_rows.size(), c.vocab);
  const PagedKvGeometry& g = kv.geometry();
  FP4MOE_CHECK(g.num_layers >= kv_layers && g.ckv_dim == c.kv_lora_rank && g.kpe_dim == c.qk_rope_dim,
               "KV pool geometry does not match the model ({} layers, latent {} + {})", kv_layers, c.kv_lora_rank,
               c.qk_rope_dim);
  validate_kv_batch(b, g.page_size, g.num_pages);
  const int32_t* tokens = token_view.ptr<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    FP4MOE_CHECK(tokens[t] >= 0 && tokens[t] < c.vocab, "token id {} is out of the vocabulary (0 .. {})", tokens[t],
                 c.vocab - 1);
    FP4MOE_CHECK(b.positions[t] < c.max_position_embeddings, "position {} is beyond max_position_embeddings {}",
                 b.positions[t], c.max_position_embeddings);
  }
  for (int32_t r : logits_rows) FP4MOE_CHECK(r >= 0 && r < T, "logits row {} of a step of {} tokens", r, T);
}

void Model::begin_step(const KvBatchView& b, Step& s) {
  const MlaModelConfig& c = cfg_;
  const int64_t T = b.num_tokens;
  arena_.reset();
  // Rows with at most topk_k causal keys select them all, so k beyond the longest request
  // changes nothing; this bounds the selection buffer.
  int64_t longest = 1;
  for (int64_t r = 0; r < b.num_requests; ++r) longest = std::max<int64_t>(longest, b.kv_len[r]);
  s.topk_k = std::min<int64_t>(c.index_topk, longest);
  s.topk = c.has_indexer() ? arena_.alloc<int32_t>(size_t(std::max<int64_t>(T * c.index_topk, 1))) : nullptr;
  s.have_topk = false;
  s.cos = arena_.alloc<float>(size_t(T * c.qk_rope_dim / 2 + 1));
  s.sin = arena_.alloc<float>(size_t(T * c.qk_rope_dim / 2 + 1));
  for (int64_t t = 0; t < T; ++t)
    rope_cos_sin(c.rope, b.positions[t], s.cos + t * (c.qk_rope_dim / 2), s.sin + t * (c.qk_rope_dim / 2));
}

void Model::block(int64_t l, const LayerWeights& lw, IndexerKind kind, float* x, float* h, float* o,
                  const KvBatchView& b, HostKvPool& kv, Step& s) {
  const int64_t T = b.num_tokens, H = cfg_.hidden;
  const float eps = float(cfg_.rms_norm_eps);
  const bool timed = log_level() <= LogLevel::Debug;
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t0 = now();
  rms_norm_rows(x, T, H, H, lw.input_norm.weight.data(), eps, h, H);
  attention(l, lw, kind, h, b, kv, s, o);
  for (int64_t i = 0; i < T * H; ++i) x[i] += o[i];
  const auto t1 = now();
  rms_norm_rows(x, T, H, H, lw.post_attention_norm.weight.data(), eps, h, H);
  mlp(l, lw, h, T, o);
  for (int64_t i = 0; i < T * H; ++i) x[i] += o[i];
  if (timed) log_debug("step of {} tokens: layer {}: attention {:.2f} ms, {} {:.2f} ms", T, l, ms(t0, t1),
                       lw.is_moe ? "moe" : "mlp", ms(t1, now()));
}

void Model::step(const TensorView& token_view, const KvBatchView& b, HostKvPool& kv,
                 const std::vector<int32_t>& logits_rows, const TensorView& logits_view, HiddenStates* hidden,
                 const StepExtras& extras) {
  const MlaModelConfig& c = cfg_;
  const int64_t T = b.num_tokens, H = c.hidden;
  check_step(token_view, b, kv, logits_rows, logits_view, c.num_layers);
  const int32_t* tokens = token_view.ptr<const int32_t>();
  float* logits = logits_rows.empty() ? nullptr : logits_view.ptr<float>();
  Step s;
  begin_step(b, s);
  step_form_ = extras.absorbed ? AttentionForm::Absorbed : AttentionForm::Auto;
  struct FormReset {
    AttentionForm& f;
    ~FormReset() { f = AttentionForm::Auto; }
  } form_reset{step_form_};

  float* x = arena_.alloc<float>(size_t(T * H));
  float* h = arena_.alloc<float>(size_t(T * H));
  float* o = arena_.alloc<float>(size_t(T * H));
  const cpu::LinearView& emb = w_.embed.w;
  for (int64_t t = 0; t < T; ++t) cpu::linear_row_cpu(emb, tokens[t], x + t * H);
  if (hidden) {
    hidden->clear();
    hidden->emplace_back(x, x + T * H);
  }
  const float eps = float(c.rms_norm_eps);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    block(l, w_.layers[size_t(l)], c.indexer[size_t(l)], x, h, o, b, kv, s);
    if (hidden && l + 1 < c.num_layers) hidden->emplace_back(x, x + T * H);
  }
  rms_norm_rows(x, T, H, H, w_.final_norm.weight.data(), eps, h, H);
  if (hidden) hidden->emplace_back(h, h + T * H);
  if (extras.final_hidden) std::memcpy(extras.final_hidden, h, size_t(T * H) * sizeof(float));
  head_rows(w_.lm_head.w, h, logits_rows, logits);
}

void Model::head_rows(const cpu::LinearView& head, const float* h, const std::vector<int32_t>& logits_rows,
                      float* logits) {
  if (logits_rows.empty()) return;
  const int64_t H = cfg_.hidden;
  float* rows = arena_.alloc<float>(logits_rows.size() * size_t(H));
  for (size_t i = 0; i < logits_rows.size(); ++i)
    std::memcpy(rows + i * size_t(H), h + int64_t(logits_rows[i]) * H, size_t(H) * sizeof(float));
  const auto t0 = std::chrono::steady_clock::now();
  cpu::linear_cpu(head, rows, int64_t(logits_rows.size()), logits, threads());
  if (log_level() <= LogLevel::Debug)
    log_debug("lm_head ({} rows) {:.2f} ms", logits_rows.size(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace fp4moe::model
