#include "engine/dist/read_plan.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "core/error.hpp"

namespace fp4moe::dist {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Expert id of ".mlp.experts.<e>." in the module name, or -1.
int64_t expert_of(std::string_view module) {
  constexpr std::string_view kKey = ".mlp.experts.";
  const size_t at = module.find(kKey);
  if (at == std::string_view::npos) return -1;
  const std::string_view rest = module.substr(at + kKey.size());
  int64_t e = -1;
  const auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), e);
  if (ec != std::errc() || p == rest.data() || p == rest.data() + rest.size() || *p != '.') return -1;
  return e;
}

// A column-parallel (Rows) or row-parallel (Cols) linear of logical [n, k]; the full range is Whole.
TensorSplit sliced(SliceKind kind, Range r, int64_t n, int64_t k) {
  const int64_t full = kind == SliceKind::Rows ? n : k;
  if (r.begin == 0 && r.end == full) return {SliceKind::Whole, {}, n, k};
  return {kind, r, n, k};
}

}  // namespace

std::string_view slice_kind_name(SliceKind k) {
  switch (k) {
    case SliceKind::Whole: return "whole";
    case SliceKind::Rows: return "rows";
    case SliceKind::Cols: return "cols";
    case SliceKind::Skip: return "skip";
  }
  return "?";
}

uint64_t RankReadPlan::bytes() const {
  uint64_t b = 0;
  for (const TensorRead& r : reads) b += r.bytes.total();
  return b;
}

TensorSplit tensor_split(const std::string& name, const model::MlaModelConfig& cfg, const RankShard& s) {
  const size_t dot = name.rfind('.');
  const std::string_view module = dot == std::string::npos ? std::string_view(name) : std::string_view(name).substr(0, dot);
  const int64_t H = cfg.hidden, heads = cfg.num_heads;
  if (ends_with(module, "lm_head")) return sliced(SliceKind::Rows, s.vocab, cfg.vocab, H);
  if (ends_with(module, ".self_attn.q_b_proj") || ends_with(module, ".self_attn.q_proj"))
    return sliced(SliceKind::Rows, s.q_rows, heads * cfg.qk_head_dim(), cfg.q_lora_rank > 0 ? cfg.q_lora_rank : H);
  if (ends_with(module, ".self_attn.kv_b_proj"))
    return sliced(SliceKind::Rows, s.kv_b_rows, heads * (cfg.qk_nope_dim + cfg.v_head_dim), cfg.kv_lora_rank);
  if (ends_with(module, ".self_attn.o_proj")) return sliced(SliceKind::Cols, s.o_cols, H, heads * cfg.v_head_dim);
  if (const int64_t e = expert_of(module); e >= 0) {
    if (!s.experts.contains(e)) return {SliceKind::Skip, {}, 0, 0};
    const int64_t I = cfg.moe.inter;
    if (ends_with(module, ".gate_proj") || ends_with(module, ".up_proj"))
      return sliced(SliceKind::Rows, s.expert_inter, I, H);
    if (ends_with(module, ".down_proj")) return sliced(SliceKind::Cols, s.expert_inter, H, I);
    return {};
  }
  if (module.find(".mlp.shared_experts.") != std::string_view::npos) {
    const int64_t I = cfg.moe.shared_inter;
    if (ends_with(module, ".gate_proj") || ends_with(module, ".up_proj"))
      return sliced(SliceKind::Rows, s.shared_inter, I, H);
    if (ends_with(module, ".down_proj")) return sliced(SliceKind::Cols, s.shared_inter, H, I);
    return {};
  }
  if (ends_with(module, ".mlp.gate_proj") || ends_with(module, ".mlp.up_proj"))
    return sliced(SliceKind::Rows, s.dense_inter, cfg.intermediate, H);
  if (ends_with(module, ".mlp.down_proj")) return sliced(SliceKind::Cols, s.dense_inter, H, cfg.intermediate);
  return {};  // embeddings, norms, q_a / kv_a, the indexer, the router: replicated
}

RankReadPlan plan_rank_reads(const Checkpoint& ck, const model::MlaModelConfig& cfg, const RankShard& shard) {
  RankReadPlan plan;
  plan.rank = shard.rank;
  for (const auto& file : ck.files()) {
    const uint64_t base = file->data_offset();
    for (const TensorInfo& t : file->tensors()) {
      TensorRead r;
      r.name = t.name;
      r.file = file->path();
      const TensorSplit sp = tensor_split(t.name, cfg, shard);
      const uint64_t nbytes = t.nbytes();
      r.kind = sp.kind;
      r.shape = t.shape;
      r.bytes = {base + t.begin, nbytes, nbytes, 1};
      // Parts that do not have the linear's n rows (scalars, per-tensor scales) are replicated.
      const bool has_rows = !t.shape.empty() && t.shape[0] == sp.n;
      if (sp.kind == SliceKind::Skip) {
        r.bytes = {base + t.begin, 0, 0, 0};
      } else if (sp.kind == SliceKind::Rows && has_rows) {
        r.logical = sp.range;
        const uint64_t row_bytes = nbytes / uint64_t(sp.n);
        r.shape[0] = sp.range.size();
        r.bytes = {base + t.begin + uint64_t(sp.range.begin) * row_bytes, uint64_t(sp.range.size()) * row_bytes,
                   uint64_t(sp.range.size()) * row_bytes, 1};
      } else if (sp.kind == SliceKind::Cols && has_rows && t.shape.size() == 2) {
        r.logical = sp.range;
        const int64_t m = t.shape[1], k = sp.k;
        FP4MOE_CHECK(m > 0 && k % m == 0 && (sp.range.begin * m) % k == 0 && (sp.range.end * m) % k == 0,
                     "{}: rank {}'s columns [{}, {}) of {} do not fall on the tensor's {} stored columns (a cut inside "
                     "a packed byte or a scale block)",
                     t.name, shard.rank, sp.range.begin, sp.range.end, k, m);
        const uint64_t elem = nbytes / uint64_t(t.shape[0] * m);
        const int64_t c0 = sp.range.begin * m / k, c1 = sp.range.end * m / k;
        r.shape[1] = c1 - c0;
        r.bytes = {base + t.begin + uint64_t(c0) * elem, uint64_t(c1 - c0) * elem, uint64_t(m) * elem,
                   uint64_t(t.shape[0])};
      } else {
        r.kind = SliceKind::Whole;
      }
      plan.reads.push_back(std::move(r));
    }
  }
  std::sort(plan.reads.begin(), plan.reads.end(), [](const TensorRead& a, const TensorRead& b) { return a.name < b.name; });
  return plan;
}

}  // namespace fp4moe::dist
