#include "model/weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cpu/expert_quantize.hpp"

namespace fp4moe::model {
namespace {


bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Binds tensors by name and remembers which ones it used.
class Binder {
 public:
  Binder(const Checkpoint& ck, bool check_only) : ck_(ck), check_only_(check_only) {}

  bool check_only() const { return check_only_; }

  const std::string& dir() const { return ck_.dir(); }

  bool has(const std::string& name) const { return ck_.find(name) != nullptr; }
  bool has_prefix(const std::string& prefix) const {
    for (const auto& f : ck_.files())
      for (const TensorInfo& t : f->tensors())
        if (t.name.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
  }

  Linear linear(const std::string& prefix, int64_t n, int64_t k) {
    const LinearTensors t = ck_.find_linear(prefix, n, k);
    for (const std::string& name : t.names) used_.insert(name);
    Linear l;
    l.input_scale = t.input_scale;
    cpu::LinearView& v = l.w;
    v.n = n;
    v.k = k;
    switch (t.format) {
      case TensorGroupFormat::ModelOptNVFP4:
      case TensorGroupFormat::CompressedNVFP4:
      case TensorGroupFormat::MXFP4:
        v.format = t.format == TensorGroupFormat::MXFP4 ? cpu::LinearFormat::MXFP4 : cpu::LinearFormat::NVFP4;
        v.packed = t.wfile->bytes(*t.weight).data();
        v.scales = t.sfile->bytes(*t.scales).data();
        v.global_scale = t.global;
        break;
      case TensorGroupFormat::BF16:
        v.format = cpu::LinearFormat::BF16;
        v.data = t.wfile->bytes(*t.weight).data();
        break;
      case TensorGroupFormat::F32:
        v.format = cpu::LinearFormat::F32;
        v.data = t.wfile->bytes(*t.weight).data();
        break;
      default: FP4MOE_FAIL("{}: '{}' has an unsupported weight layout", dir(), prefix);
    }
    return l;
  }

  // A BF16 / F32 vector [dim] copied to FP32; finite values only.
  std::vector<float> vec(const std::string& name, int64_t dim, const char* what) {
    const SafetensorsFile* f = nullptr;
    const TensorInfo* t = ck_.find(name, &f);
    FP4MOE_CHECK(t != nullptr, "{}: missing {} tensor '{}'", dir(), what, name);
    FP4MOE_CHECK(t->dtype == DType::BF16 || t->dtype == DType::F32, "{}: {} '{}' must be BF16 or F32, is {}", dir(),
                 what, name, dtype_name(t->dtype));
    FP4MOE_CHECK(t->shape == std::vector<int64_t>{dim}, "{}: {} '{}' has shape {}, expected [{}]", dir(), what, name,
                 shape_str(t->shape), dim);
    used_.insert(name);
    if (check_only_) return {};
    const auto b = f->bytes(*t);
    std::vector<float> v(static_cast<size_t>(dim));
    for (int64_t i = 0; i < dim; ++i) {
      if (t->dtype == DType::F32) {
        std::memcpy(&v[size_t(i)], b.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        v[size_t(i)] = bf16_to_float(h);
      }
      FP4MOE_CHECK(std::isfinite(v[size_t(i)]), "{}: {} '{}' has a non-finite value at {}", dir(), what, name, i);
    }
    return v;
  }

  NormWeights rms_norm(const std::string& prefix, int64_t dim) { return {vec(prefix + ".weight", dim, "norm"), {}}; }
  NormWeights layer_norm(const std::string& prefix, int64_t dim) {
    return {vec(prefix + ".weight", dim, "norm"), vec(prefix + ".bias", dim, "norm bias")};
  }

  // Embedding-like [rows, cols] BF16/F32 matrix as a linear view.
  Linear matrix(const std::string& name, int64_t rows, int64_t cols, const char* what) {
    const SafetensorsFile* f = nullptr;
    const TensorInfo* t = ck_.find(name, &f);
    FP4MOE_CHECK(t != nullptr, "{}: missing {} tensor '{}'", dir(), what, name);
    FP4MOE_CHECK(t->dtype == DType::BF16 || t->dtype == DType::F32, "{}: {} '{}' must be BF16 or F32, is {}", dir(),
                 what, name, dtype_name(t->dtype));
    FP4MOE_CHECK(t->shape == (std::vector<int64_t>{rows, cols}), "{}: {} '{}' has shape {}, expected [{}, {}]", dir(),
                 what, name, shape_str(t->shape), rows, cols);
    used_.insert(name);
    Linear l;
    l.w.format = t->dtype == DType::BF16 ? cpu::LinearFormat::BF16 : cpu::LinearFormat::F32;
    l.w.n = rows;
    l.w.k = cols;
    l.w.data = f->bytes(*t).data();
    return l;
  }

  // Every tensor of the checkpoint must have been bound (or be one of the ignored kinds).
  void check_all_used() const {
    int64_t extra = 0;
    std::string first;
    for (const auto& f : ck_.files())
      for (const TensorInfo& t : f->tensors()) {
        if (used_.count(t.name) || ends_with(t.name, ".k_scale") || ends_with(t.name, ".v_scale") ||
            ends_with(t.name, ".rotary_emb.inv_freq"))
          continue;
        if (extra++ == 0) first = t.name;
      }
    FP4MOE_CHECK(extra == 0, "{}: unexpected tensor '{}'{} (not part of the model as its config.json describes it)",
                 dir(), first, extra > 1 ? fmt::format(" and {} more", extra - 1) : "");
  }

 private:
  const Checkpoint& ck_;
  bool check_only_ = false;
  std::set<std::string> used_;
};

WeightFormat expert_format(const Linear& l, const std::string& name, const std::string& dir) {
  switch (l.w.format) {
    case cpu::LinearFormat::NVFP4: return WeightFormat::NVFP4;
    case cpu::LinearFormat::MXFP4: return WeightFormat::MXFP4;
    case cpu::LinearFormat::BF16: return WeightFormat::BF16;
    case cpu::LinearFormat::F32: break;
  }
  FP4MOE_FAIL("{}: expert weight '{}' is F32; expert stacks take NVFP4, MXFP4 or BF16", dir, name);
}

// E experts, each `parts` linears [n_part, k], as a view-mode stack.
ExpertStack expert_stack(Binder& b, const std::vector<std::vector<std::string>>& prefixes, int64_t n_part, int64_t k,
                         bool* has_input_scale) {
  ExpertStack s;
  s.num_experts = int64_t(prefixes.size());
  s.parts = int64_t(prefixes[0].size());
  s.n = n_part * s.parts;
  s.k = k;
  for (size_t e = 0; e < prefixes.size(); ++e)
    for (const std::string& p : prefixes[e]) {
      const Linear l = b.linear(p, n_part, k);
      const WeightFormat f = expert_format(l, p, b.dir());
      if (e == 0 && s.views.empty()) s.format = f;
      FP4MOE_CHECK(f == s.format, "{}: '{}' is {} but '{}' is {}", b.dir(), p, weight_format_name(f), prefixes[0][0],
                   weight_format_name(s.format));
      ExpertStack::PartView v;
      v.packed = l.w.packed;
      v.scales = l.w.scales;
      v.bf16 = static_cast<const uint16_t*>(l.w.data);
      v.global_scale = l.w.global_scale;
      s.views.push_back(v);
      s.input_scale = std::max(s.input_scale, l.input_scale);
      if (has_input_scale && l.input_scale > 0) *has_input_scale = true;
    }
  return s;
}

struct RoleFormats {
  std::map<std::string, std::set<std::string>> by_role;
  void add(const std::string& role, const Linear& l) { by_role[role].insert(std::string(cpu::linear_format_name(l.w.format))); }
  void add(const std::string& role, WeightFormat f) { by_role[role].insert(std::string(weight_format_name(f))); }
  std::string str() const {
    std::string s;
    for (const auto& [role, fs] : by_role) {
      std::string f;
      for (const std::string& x : fs) f += (f.empty() ? "" : "+") + x;
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ", role, f);
    }
    return s;
  }
};

LayerWeights bind_layer(Binder& b, const MlaModelConfig& c, int64_t l, IndexerKind indexer, bool moe, RoleFormats& rf,
                        bool* w4a4) {
  const std::string L = fmt::format("model.layers.{}.", l);
  const int64_t H = c.hidden, NH = c.num_heads;
  LayerWeights w;
  w.input_norm = b.rms_norm(L + "input_layernorm", H);
  w.post_attention_norm = b.rms_norm(L + "post_attention_layernorm", H);
  AttentionWeights& a = w.attn;
  const std::string A = L + "self_attn.";
  if (c.q_lora_rank > 0) {
    a.q_a = b.linear(A + "q_a_proj", c.q_lora_rank, H);
    a.q_a_norm = b.rms_norm(A + "q_a_layernorm", c.q_lora_rank);
    a.q_b = b.linear(A + "q_b_proj", NH * c.qk_head_dim(), c.q_lora_rank);
    rf.add("attention", a.q_a);
    rf.add("attention", a.q_b);
  } else {
    a.q_proj = b.linear(A + "q_proj", NH * c.qk_head_dim(), H);
    rf.add("attention", a.q_proj);
  }
  a.kv_a = b.linear(A + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_dim, H);
  a.kv_a_norm = b.rms_norm(A + "kv_a_layernorm", c.kv_lora_rank);
  a.kv_b = b.linear(A + "kv_b_proj", NH * (c.qk_nope_dim + c.v_head_dim), c.kv_lora_rank);
  a.o = b.linear(A + "o_proj", H, NH * c.v_head_dim);
  for (const Linear* x : {&a.kv_a, &a.kv_b, &a.o}) rf.add("attention", *x);
  if (indexer == IndexerKind::Full) {
    IndexerWeights ix;
    const std::string I = A + "indexer.";
    ix.wq_b = b.linear(I + "wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    ix.wk = b.linear(I + "wk", c.index_head_dim, H);
    ix.k_norm = b.layer_norm(I + "k_norm", c.index_head_dim);
    ix.weights_proj = b.linear(I + "weights_proj", c.index_n_heads, H);
    for (const Linear* x : {&ix.wq_b, &ix.wk, &ix.weights_proj}) rf.add("indexer", *x);
    a.indexer = std::move(ix);
  } else if (indexer == IndexerKind::Shared) {
    FP4MOE_CHECK(!b.has_prefix(A + "indexer."),
                 "{}: layer {} is a \"shared\" indexer layer but has indexer weights ('{}indexer.*')", b.dir(), l, A);
  }
  w.is_moe = moe;
  const std::string M = L + "mlp.";
  if (!moe) {
    w.mlp.gate = b.linear(M + "gate_proj", c.intermediate, H);
    w.mlp.up = b.linear(M + "up_proj", c.intermediate, H);
    w.mlp.down = b.linear(M + "down_proj", H, c.intermediate);
    for (const Linear* x : {&w.mlp.gate, &w.mlp.up, &w.mlp.down}) rf.add("dense mlp", *x);
    return w;
  }
  MoeLayerWeights& m = w.moe;
  m.cfg = c.moe;
  const int64_t E = c.moe.num_experts, I = c.moe.inter;
  if (const Linear g = b.matrix(M + "gate.weight", E, H, "router"); !b.check_only()) {
    m.router_w.resize(size_t(E * H));
    for (int64_t e = 0; e < E; ++e) cpu::linear_row_cpu(g.w, e, m.router_w.data() + e * H);
    // A non-finite router weight would route every token by NaN comparisons: refused, as the
    // correction bias is (vec()) and as Checkpoint::load_moe_layer does.
    for (size_t i = 0; i < m.router_w.size(); ++i)
      FP4MOE_CHECK(std::isfinite(m.router_w[i]), "{}: router '{}gate.weight' has a non-finite value {} at row {}, column {}",
                   b.dir(), M, m.router_w[i], int64_t(i) / H, int64_t(i) % H);
  }
  if (b.has(M + "gate.e_score_correction_bias")) {
    m.router_bias = b.vec(M + "gate.e_score_correction_bias", E, "correction bias");
  } else {
    FP4MOE_CHECK(c.topk_method != "noaux_tc", "{}: missing tensor '{}gate.e_score_correction_bias' (topk_method noaux_tc)",
                 b.dir(), M);
  }
  std::vector<std::vector<std::string>> w13(static_cast<size_t>(E)), w2(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = fmt::format("{}experts.{}.", M, e);
    w13[size_t(e)] = {p + "gate_proj", p + "up_proj"};
    w2[size_t(e)] = {p + "down_proj"};
  }
  m.w13 = expert_stack(b, w13, I, H, w4a4);
  m.w2 = expert_stack(b, w2, H, I, w4a4);
  rf.add("experts", m.w13.format);
  if (c.moe.shared_inter > 0) {
    const std::string S = M + "shared_experts.";
    m.shared_w13 = expert_stack(b, {{S + "gate_proj", S + "up_proj"}}, c.moe.shared_inter, H, nullptr);
    m.shared_w2 = expert_stack(b, {{S + "down_proj"}}, H, c.moe.shared_inter, nullptr);
    rf.add("shared expert", m.shared_w13->format);
  }
  return w;
}

}  // namespace

ModelWeights bind_weights(const Checkpoint& ck, const MlaModelConfig& c, bool check_only) {
  Binder b(ck, check_only);
  ModelWeights w;
  RoleFormats rf;
  bool w4a4 = false;
  w.embed = b.matrix("model.embed_tokens.weight", c.vocab, c.hidden, "embedding");
  for (int64_t l = 0; l < c.num_layers; ++l)
    w.layers.push_back(bind_layer(b, c, l, c.indexer[size_t(l)], c.moe_layer[size_t(l)], rf, &w4a4));
  w.final_norm = b.rms_norm("model.norm", c.hidden);
  if (b.has("lm_head.weight") || !c.tie_word_embeddings) {
    w.lm_head = b.linear("lm_head", c.vocab, c.hidden);
  } else {
    w.lm_head = w.embed;
  }
  rf.add("lm_head", w.lm_head);

  // MTP layers: bound when present, never as decoder layers.
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int64_t l = c.num_layers + i;
    const std::string P = fmt::format("model.layers.{}.", l);
    if (!b.has_prefix(P)) continue;
    MtpWeights m;
    m.enorm = b.rms_norm(P + "enorm", c.hidden);
    m.hnorm = b.rms_norm(P + "hnorm", c.hidden);
    m.shared_head_norm = b.rms_norm(P + "shared_head.norm", c.hidden);
    m.eh_proj = b.linear(P + "eh_proj", c.hidden, 2 * c.hidden);
    if (b.has(P + "embed_tokens.weight")) m.embed = b.matrix(P + "embed_tokens.weight", c.vocab, c.hidden, "MTP embedding");
    if (b.has_prefix(P + "shared_head.head.")) m.head = b.linear(P + "shared_head.head", c.vocab, c.hidden);
    const IndexerKind ik = !c.has_indexer() ? IndexerKind::None
                           : b.has_prefix(P + "self_attn.indexer.") ? IndexerKind::Full
                                                                    : IndexerKind::Shared;
    RoleFormats mtp_rf;
    m.layer = bind_layer(b, c, l, ik, true, mtp_rf, nullptr);
    w.mtp.push_back(std::move(m));
  }
  b.check_all_used();

  size_t bytes = 0;
  for (const auto& f : ck.files())
    for (const TensorInfo& t : f->tensors()) bytes += t.nbytes();
  w.summary = fmt::format("{}{}; MTP layers: {} of {}; {:.1f} MB viewed in place", rf.str(),
                          w4a4 ? " (W4A4 input_scale present: activations stay FP32 on the CPU backend)" : "",
                          w.mtp.size(), c.num_nextn_predict_layers, double(bytes) / 1e6);
  return w;
}

int64_t quantize_mtp_experts(ModelWeights& w, int threads) {
  int64_t n = 0;
  for (MtpWeights& m : w.mtp) {
    MoeLayerWeights& moe = m.layer.moe;
    if (!m.layer.is_moe || moe.w13.is_fp4()) continue;
    FP4MOE_CHECK(!moe.w2.is_fp4(), "MTP layer: BF16 gate/up experts with {} down experts", weight_format_name(moe.w2.format));
    moe.w13 = cpu::quantize_experts_nvfp4(moe.w13, threads);
    moe.w2 = cpu::quantize_experts_nvfp4(moe.w2, threads);
    n += moe.w13.num_experts;
  }
  return n;
}

}  // namespace fp4moe::model
