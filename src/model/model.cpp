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
#include "model/cpu_ops.hpp"

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
  if (opt.quantize_mtp_experts) {  // one start-up line says so
    const auto q0 = std::chrono::steady_clock::now();
    if (const int64_t n = quantize_mtp_experts(m->w_, opt.threads > 0 ? opt.threads : default_num_threads()); n > 0)
      log_info("the MTP layer's {} BF16 routed experts quantized to NVFP4 for the drafts in {:.1f} s "
               "(--speculative-draft-model-quantization unquant keeps them)",
               n, std::chrono::duration<double>(std::chrono::steady_clock::now() - q0).count());
  }
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

void Model::check_step(const TensorView& token_view, const KvBatchView& b, const HostKvPool& kv,
                       const std::vector<int32_t>& logits_rows, const TensorView& logits_view, int64_t kv_layers) {
  const MlaModelConfig& c = cfg_;
  const int64_t T = b.num_tokens;
  // The CUDA runner's rule (gpu_step.cpp, gpu_mtp.cpp): a caller that sends nothing has lost count.
  FP4MOE_CHECK(T >= 1 && b.num_requests >= 1, "step: empty batch ({} tokens, {} requests)", T, b.num_requests);
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

void Model::step(const TensorView& token_view, const KvBatchView& b, HostKvPool& kv,
                 const std::vector<int32_t>& logits_rows, const TensorView& logits_view, HiddenStates* hidden,
                 const StepExtras& extras) {
  const int64_t T = b.num_tokens, H = cfg_.hidden;
  check_step(token_view, b, kv, logits_rows, logits_view, cfg_.num_layers);
  CpuOps ops(cfg_, w_, opt_, arena_, kv, b, extras.absorbed ? AttentionForm::Absorbed : opt_.attention);
  ops.begin_step();
  ForwardViews v;
  v.tokens = token_view;
  v.x = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.h = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.o = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.rows = TensorView::of(logits_rows.data(), {int64_t(logits_rows.size())});
  if (!logits_rows.empty()) v.logits = logits_view;
  v.hidden = hidden;
  v.final_hidden = extras.final_hidden;
  forward(ops, cfg_, v);
}

}  // namespace fp4moe::model
