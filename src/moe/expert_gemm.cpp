// The GEMM switch of the MoE layer (see expert_gemm.hpp).
//
// Paths:
//  - Sm90 (cuda/moe_gemm/moe_gemm.hpp: upload_weights + run_moe_gemm): the sm_90a wgmma
//    kernel, weights re-laid at upload; its TileConfig per call comes from the tuner's plan
//    cache when a tuned bucket exists (tuner::plan_for), else from cuda::default_config
//    with the expected tokens per hit expert. W4A16, or W4A4 emulation.
//  - Generic (generic_nvfp4_grouped_gemm.hpp): linear checkpoint layout, any shape/arch.
// Both read the expert offsets on the device and need no host sync: graph-capturable.
// Auto = Sm90 when the GPU is sm_90 and the shape fits it, else Generic. The environment
// variable FP4MOE_MOE_GEMM=generic|sm90 overrides Auto.
#include "moe/expert_gemm.hpp"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#if defined(FP4MOE_MOE_HAVE_TUNER)
#include "tuner/plan_cache.hpp"
#endif

namespace fp4moe {

const char* moe_gemm_path_name(MoeGemmPath p) {
  switch (p) {
    case MoeGemmPath::Auto: return "auto";
    case MoeGemmPath::Generic: return "generic";
    case MoeGemmPath::Sm90: return "sm90";
  }
  return "?";
}

namespace moe {
namespace {

using Stacks = std::vector<const ExpertStack*>;

cuda::MoeGemmDesc make_desc(const Stacks& s, cuda::Epilogue ep, int64_t max_rows, bool w4a4) {
  cuda::MoeGemmDesc d;
  int64_t E = 0;
  for (const ExpertStack* x : s) E += x->num_experts;
  d.num_experts = int(E);
  d.n = int(s.front()->n);
  d.k = int(s.front()->k);
  d.max_tokens = int(max_rows);
  d.weight = s.front()->format;
  d.act = w4a4 ? cuda::ActFormat::NVFP4_EMULATED : cuda::ActFormat::BF16;
  d.epilogue = ep;
  return d;
}

cuda::MoeGemmArgs make_args(const void* x, const int32_t* offsets, const float* row_scale, void* y, int64_t m_total,
                            void* workspace, cudaStream_t stream) {
  cuda::MoeGemmArgs a;
  a.x = x;
  a.expert_offsets = offsets;
  a.row_scale = row_scale;
  a.y = y;
  a.m_total = int(m_total);
  a.workspace = workspace;
  a.stream = stream;
  return a;
}

class GenericExpertGemm final : public ExpertGemmWeights {
 public:
  GenericExpertGemm(const Stacks& s, cuda::Epilogue ep, int64_t max_rows) : dev_(s), ep_(ep) {
    bytes_per_expert_ = s.front()->weight_bytes_per_expert();
    n_ = s.front()->n;
    k_ = s.front()->k;
    desc_ = make_desc(s, ep, max_rows, false);
    const std::string why = cuda::generic_can_implement(desc_, dev_.view());
    FP4MOE_CHECK(why.empty(), "expert GEMM [{}, {}, {}]: {}", desc_.num_experts, n_, k_, why);
  }
  void run(cuda::Epilogue ep, const void* x, const int32_t* offsets, const float* row_scale, void* y,
           int64_t m_total, void* workspace, cudaStream_t stream) const override {
    FP4MOE_CHECK(ep == ep_, "expert GEMM: uploaded for another epilogue");
    cuda::run_generic_grouped_gemm(desc_, dev_.view(), make_args(x, offsets, row_scale, y, m_total, workspace, stream));
  }
  size_t workspace_bytes() const override { return 0; }
  std::string describe() const override { return "generic " + cuda::to_string(cuda::generic_tile_config()); }
  std::string config_for(int64_t) const override { return describe(); }

 private:
  cuda::DeviceLinearFp4Weights dev_;
  cuda::Epilogue ep_;
  cuda::MoeGemmDesc desc_;
};

class Sm90ExpertGemm final : public ExpertGemmWeights {
 public:
  Sm90ExpertGemm(const Stacks& s, cuda::Epilogue ep, int64_t max_rows, int rows_per_token, int always_hit,
                 bool w4a4)
      : ep_(ep), rows_per_token_(rows_per_token), always_hit_(always_hit) {
    bytes_per_expert_ = s.front()->weight_bytes_per_expert();
    n_ = s.front()->n;
    k_ = s.front()->k;
    desc_ = make_desc(s, ep, max_rows, w4a4);
    const std::vector<cuda::TileConfig> cands = cuda::candidate_configs(desc_);
    FP4MOE_CHECK(!cands.empty(), "sm90 expert GEMM: no config for [{}, {}, {}]", desc_.num_experts, n_, k_);
    for (const cuda::TileConfig& c : cands) ws_bytes_ = std::max(ws_bytes_, cuda::workspace_bytes(desc_, c));
    dev_ = s.size() == 1 ? cuda::upload_weights(*s.front(), ep) : cuda::upload_weights_concat(s, ep);
  }
  void run(cuda::Epilogue ep, const void* x, const int32_t* offsets, const float* row_scale, void* y,
           int64_t m_total, void* workspace, cudaStream_t stream) const override {
    FP4MOE_CHECK(ep == ep_, "expert GEMM: uploaded for another epilogue");
    cuda::MoeGemmArgs a = make_args(x, offsets, row_scale, y, m_total, workspace, stream);
    const cuda::TileConfig c = pick(m_total);
    if (const auto sh = shared_config(m_total, c)) {
      // Folded shared pieces hold one row per token: a decode tile narrower than the batch
      // would re-read their weights once per tile, so they get a wide tile of their own
      // (same weights, same offsets, same workspace: two launches back to back).
      a.expert_end = desc_.num_experts - always_hit_;
      cuda::run_moe_gemm(desc_, c, dev_, a);
      a.expert_begin = a.expert_end;
      a.expert_end = -1;
      cuda::run_moe_gemm(desc_, *sh, dev_, a);
      return;
    }
    cuda::run_moe_gemm(desc_, c, dev_, a);
  }
  size_t workspace_bytes() const override { return ws_bytes_; }
  std::string describe() const override { return "sm90 (config per tokens bucket)"; }
  std::string config_for(int64_t m_total) const override {
    const cuda::TileConfig c = pick(m_total);
    if (const auto sh = shared_config(m_total, c)) return cuda::to_string(c) + " + shared " + cuda::to_string(*sh);
    return cuda::to_string(c);
  }

 private:
  // The folded shared pieces' own config when the routed config's token tile is narrower
  // than the batch (decode kernel at more tokens than its tile), else none.
  std::optional<cuda::TileConfig> shared_config(int64_t m_total, const cuda::TileConfig& routed) const {
    const int64_t tokens = std::max<int64_t>(1, m_total / rows_per_token_);
    if (always_hit_ == 0 || routed.kernel != cuda::GemmKernel::Sm90Decode || tokens <= routed.block_n)
      return std::nullopt;
    return cuda::default_config(desc_, double(tokens));
  }

  // The tuned tactic of this bucket when the plan cache has one (for the folded set: its
  // own entry, else the routed-only problem's), else the kernel's default for the expected
  // rows per hit routed expert (routed rows spread uniformly over the routed experts; the
  // always-hit experts' one row per token is left out).
  cuda::TileConfig pick(int64_t m_total) const {
    const int64_t tokens = std::max<int64_t>(1, m_total / rows_per_token_);
#if defined(FP4MOE_MOE_HAVE_TUNER)
    tuner::GemmProblem p;
    p.num_experts = desc_.num_experts;
    p.n = desc_.n;
    p.k = desc_.k;
    p.top_k = rows_per_token_;
    p.weight = desc_.weight;
    p.act = desc_.act == cuda::ActFormat::BF16 ? tuner::Act::BF16 : tuner::Act::NVFP4;
    p.epilogue = ep_ == cuda::Epilogue::SiluMul    ? tuner::Epi::SiluMul
                 : ep_ == cuda::Epilogue::RowScale ? tuner::Epi::RowScale
                                                   : tuner::Epi::None;
    for (int attempt = 0; attempt < (always_hit_ > 0 ? 2 : 1); ++attempt) {
      if (attempt == 1) {  // the routed experts alone, as `fp4moe tune` measures them
        p.num_experts = desc_.num_experts - always_hit_;
        p.top_k = rows_per_token_ - always_hit_;
      }
      const tuner::Tactic t = tuner::plan_for(p, tokens);
      if (t.impl != tuner::Impl::Sm90Wgmma && t.impl != tuner::Impl::Sm90Decode) continue;
      cuda::TileConfig c;
      c.kernel = t.impl == tuner::Impl::Sm90Wgmma ? cuda::GemmKernel::Sm90Wgmma : cuda::GemmKernel::Sm90Decode;
      c.block_m = t.cfg.block_m;
      c.block_n = t.cfg.block_n;
      c.block_k = t.cfg.block_k;
      c.stages = t.cfg.stages;
      c.split_k = t.cfg.split_k;
      c.cluster = t.cfg.cluster;
      if (cuda::can_implement(desc_, c, 90).empty()) return c;
    }
#endif
    const double m = double(std::max<int64_t>(m_total, 1));
    const double routed_e = std::max(1, desc_.num_experts - always_hit_);
    const double routed_m = std::max(0.0, m - double(always_hit_) * double(tokens));
    const double routed_hit = routed_e * (1.0 - std::pow(1.0 - 1.0 / routed_e, routed_m));
    // The routed experts' tile (with always_hit_ = 0, routed_m = m); folded shared pieces get
    // their own launch when they would not fit it (shared_config).
    return cuda::default_config(desc_, routed_m / std::max(routed_hit, 1.0));
  }

  cuda::DeviceExpertWeights dev_;
  cuda::Epilogue ep_;
  int rows_per_token_ = 1;
  int always_hit_ = 0;
  cuda::MoeGemmDesc desc_;
  size_t ws_bytes_ = 0;
};

int device_sm() {
  int dev = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  FP4MOE_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.major * 10 + p.minor;
}

MoeGemmPath resolve(MoeGemmPath want, const Stacks& s, cuda::Epilogue ep, int64_t max_rows, bool w4a4) {
  if (const char* env = std::getenv("FP4MOE_MOE_GEMM"); env && *env && want == MoeGemmPath::Auto) {
    const std::string_view v(env);
    FP4MOE_CHECK(v == "generic" || v == "sm90" || v == "auto", "FP4MOE_MOE_GEMM={}: expected generic, sm90 or auto", v);
    want = v == "generic" ? MoeGemmPath::Generic : v == "sm90" ? MoeGemmPath::Sm90 : MoeGemmPath::Auto;
  }
  if (want != MoeGemmPath::Auto) return want;
  if (w4a4) return MoeGemmPath::Sm90;  // the only path with the W4A4 emulation
  const cuda::MoeGemmDesc d = make_desc(s, ep, max_rows, w4a4);
  const std::vector<cuda::TileConfig> cands = cuda::candidate_configs(d);
  if (cands.empty()) return MoeGemmPath::Generic;
  const std::string why = cuda::can_implement(d, cands.front(), device_sm());
  if (!why.empty()) log_debug("expert GEMM [{}, {}, {}]: sm90 path not used: {}", d.num_experts, d.n, d.k, why);
  return why.empty() ? MoeGemmPath::Sm90 : MoeGemmPath::Generic;
}

}  // namespace

std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const std::vector<const ExpertStack*>& stacks,
                                                      cuda::Epilogue epilogue, int64_t max_rows, int rows_per_token,
                                                      int always_hit, MoeGemmPath path, bool w4a4) {
  FP4MOE_CHECK(!stacks.empty(), "expert GEMM: no expert stacks");
  int64_t E = 0;
  for (const ExpertStack* s : stacks) {
    FP4MOE_CHECK(s != nullptr, "expert GEMM: null expert stack");
    FP4MOE_CHECK(s->is_fp4(), "expert GEMM: FP4 weights needed, got {}", weight_format_name(s->format));
    FP4MOE_CHECK(s->format == stacks.front()->format && s->n == stacks.front()->n && s->k == stacks.front()->k,
                 "expert GEMM: stacks differ ({} [{}, {}] vs {} [{}, {}])", weight_format_name(s->format), s->n, s->k,
                 weight_format_name(stacks.front()->format), stacks.front()->n, stacks.front()->k);
    E += s->num_experts;
  }
  FP4MOE_CHECK(max_rows >= 1 && max_rows < (int64_t(1) << 31), "expert GEMM: max_rows = {}", max_rows);
  FP4MOE_CHECK(rows_per_token >= 1 && always_hit >= 0 && always_hit < rows_per_token && always_hit < E,
               "expert GEMM: rows_per_token {} / always_hit {} / {} experts", rows_per_token, always_hit, E);
  const MoeGemmPath p = resolve(path, stacks, epilogue, max_rows, w4a4);
  FP4MOE_CHECK(!(w4a4 && p == MoeGemmPath::Generic), "expert GEMM: W4A4 emulation needs the sm90 path");
  if (p == MoeGemmPath::Sm90)
    return std::make_unique<Sm90ExpertGemm>(stacks, epilogue, max_rows, rows_per_token, always_hit, w4a4);
  return std::make_unique<GenericExpertGemm>(stacks, epilogue, max_rows);
}

std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const ExpertStack& stack, cuda::Epilogue epilogue,
                                                      int64_t max_rows, int rows_per_token, MoeGemmPath path,
                                                      bool w4a4) {
  return upload_expert_gemm(std::vector<const ExpertStack*>{&stack}, epilogue, max_rows, rows_per_token, 0, path,
                            w4a4);
}

}  // namespace moe
}  // namespace fp4moe
