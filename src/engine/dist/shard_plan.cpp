#include "engine/dist/shard_plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4moe::dist {

Range split_block(int64_t n, int64_t parts, int64_t part) {
  FP4MOE_CHECK(parts >= 1 && part >= 0 && part < parts && n >= 0, "split_block: part {} of {} over {}", part, parts,
               n);
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = part * base + std::min(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

Range split_even(int64_t n, int64_t parts, int64_t part) {
  FP4MOE_CHECK(parts >= 1 && n % parts == 0, "split_even: {} is not divisible by {}", n, parts);
  return split_block(n, parts, part);
}

std::string_view moe_comm_name(MoeComm m) { return m == MoeComm::AllReduce ? "all-reduce" : "dispatch-combine"; }

void validate_parallel(const ParallelConfig& p) {
  FP4MOE_CHECK(p.tp >= 1, "--tp {}: must be at least 1", p.tp);
  FP4MOE_CHECK(p.ep >= 1, "--ep {}: must be at least 1", p.ep);
  FP4MOE_CHECK(p.tp == p.ep || p.tp == 1 || p.ep == 1,
               "--tp {} --ep {}: tp and ep must be equal, or one of them 1 (one group of ranks)", p.tp, p.ep);
}

namespace {

// A dimension split over tp ranks: divisible, and (for a reduction dim) a multiple of 16
// per rank (FP4 scale blocks, the kernels' K step).
void check_tp_dim(int64_t tp, int64_t n, const char* what, bool reduction_dim) {
  if (n == 0 || tp == 1) return;
  FP4MOE_CHECK(n % tp == 0, "--tp {}: {} ({}) is not divisible by {}", tp, what, n, tp);
  FP4MOE_CHECK(!reduction_dim || (n / tp) % 16 == 0,
               "--tp {}: {} / {} = {} per rank is not a multiple of 16 (FP4 scale blocks, kernel K step)", tp, what,
               tp, n / tp);
}

}  // namespace

ShardPlan plan_shards(const model::MlaModelConfig& cfg, const ParallelConfig& par) {
  validate_parallel(par);
  const int64_t tp = par.tp, ep = par.ep;
  const bool has_moe = std::find(cfg.moe_layer.begin(), cfg.moe_layer.end(), true) != cfg.moe_layer.end();
  const bool has_dense = std::find(cfg.moe_layer.begin(), cfg.moe_layer.end(), false) != cfg.moe_layer.end();
  const int64_t E = has_moe ? cfg.moe.num_experts : 0;
  FP4MOE_CHECK(cfg.num_heads > 0 && cfg.vocab > 0, "sharding: the model has {} heads and vocab {}", cfg.num_heads,
               cfg.vocab);
  FP4MOE_CHECK(cfg.num_heads % tp == 0, "--tp {}: {} attention heads are not divisible by {}", tp, cfg.num_heads, tp);
  check_tp_dim(tp, cfg.num_heads * cfg.v_head_dim, "o_proj's input (heads × v_head_dim)", true);
  if (has_dense) check_tp_dim(tp, cfg.intermediate, "the dense MLP's intermediate size", true);
  if (has_moe) check_tp_dim(tp, cfg.moe.shared_inter, "the shared expert's intermediate size", true);
  check_tp_dim(tp, cfg.vocab, "the vocabulary (lm_head rows)", false);
  if (ep > 1) {
    FP4MOE_CHECK(has_moe, "--ep {}: the model has no MoE layer", ep);
    FP4MOE_CHECK(ep <= E, "--ep {}: only {} routed experts, a rank would own none", ep, E);
  } else if (has_moe) {
    check_tp_dim(tp, cfg.moe.inter, "the routed experts' intermediate size (ep 1: experts split by tp)", true);
  }

  ShardPlan plan;
  plan.par = par;
  for (int64_t r = 0; r < par.world(); ++r) {
    RankShard s;
    s.rank = r;
    const int64_t t = tp == 1 ? 0 : r;  // tp == 1: every rank holds the whole attention / dense part
    s.heads = split_even(cfg.num_heads, tp, t);
    s.q_rows = {s.heads.begin * cfg.qk_head_dim(), s.heads.end * cfg.qk_head_dim()};
    const int64_t kvb = cfg.qk_nope_dim + cfg.v_head_dim;
    s.kv_b_rows = {s.heads.begin * kvb, s.heads.end * kvb};
    s.o_cols = {s.heads.begin * cfg.v_head_dim, s.heads.end * cfg.v_head_dim};
    s.dense_inter = has_dense ? split_even(cfg.intermediate, tp, t) : Range{};
    s.shared_inter = has_moe ? split_even(cfg.moe.shared_inter, tp, t) : Range{};
    s.vocab = split_even(cfg.vocab, tp, t);
    if (ep > 1) {
      s.experts = split_block(E, ep, r);
      s.expert_inter = {0, cfg.moe.inter};
    } else {
      s.experts = {0, E};
      s.expert_inter = has_moe ? split_even(cfg.moe.inter, tp, t) : Range{};
    }
    plan.ranks.push_back(s);
  }
  return plan;
}

size_t kv_bytes_per_token_per_rank(const model::MlaModelConfig& cfg, KvElem elem, KvElem index_elem) {
  size_t bytes = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    bytes += size_t(cfg.kv_lora_rank + cfg.qk_rope_dim) * kv_elem_size(elem);
    if (size_t(l) < cfg.indexer.size() && cfg.indexer[size_t(l)] == model::IndexerKind::Full)
      bytes += size_t(cfg.index_head_dim) * kv_elem_size(index_elem);
  }
  return bytes;
}

}  // namespace fp4moe::dist
