// Host side of the router: config translation and validation (fmt lives here, not in .cu).
#include "cuda/routing/router.hpp"

#include "core/error.hpp"

namespace fp4moe::cuda {

RouterDesc router_desc_from(const MoeConfig& cfg) {
  RouterDesc d;
  d.num_experts = int(cfg.num_experts);
  d.top_k = int(cfg.top_k);
  d.n_group = int(cfg.n_group);
  d.topk_group = int(cfg.topk_group);
  d.scoring = cfg.scoring;
  d.norm_topk_prob = cfg.norm_topk_prob;
  d.routed_scaling = cfg.routed_scaling;
  return d;
}

void check_router_desc(const RouterDesc& d) {
  FP4MOE_CHECK(d.num_experts >= 1 && d.num_experts <= kMaxRouterExperts,
               "router: {} experts; the CUDA router supports 1..{}", d.num_experts, kMaxRouterExperts);
  FP4MOE_CHECK(d.top_k >= 1 && d.top_k <= kMaxRouterTopK && d.top_k <= d.num_experts,
               "router: top_k = {} must be in 1..min({}, E = {})", d.top_k, kMaxRouterTopK, d.num_experts);
  FP4MOE_CHECK(d.n_group >= 1 && d.n_group <= kMaxRouterGroups && d.num_experts % d.n_group == 0,
               "router: n_group = {} must divide E = {} and be <= {}", d.n_group, d.num_experts,
               kMaxRouterGroups);
  FP4MOE_CHECK(d.topk_group >= 1 && d.topk_group <= d.n_group,
               "router: topk_group = {} must be in 1..n_group = {}", d.topk_group, d.n_group);
  FP4MOE_CHECK(int64_t(d.topk_group) * (d.num_experts / d.n_group) >= d.top_k,
               "router: topk_group {} x group size {} < top_k {}", d.topk_group,
               d.num_experts / d.n_group, d.top_k);
}

}  // namespace fp4moe::cuda
