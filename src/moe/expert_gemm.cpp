// The GEMM switch of the MoE layer (see expert_gemm.hpp).
//
// Paths:
//  - Sm90 (cuda/moe_gemm/moe_gemm.hpp: upload_weights + run_moe_gemm): the sm_90a kernels,
//    weights re-laid at upload. Each tokens bucket's TileConfig is chosen at upload: the
//    tuner's plan for the bucket (tuner::plan_for on the kernel descriptor) when
//    `fp4moe tune` stored one, else cuda::default_config. W4A16, or W4A4 emulation.
//  - Sm1xx (cuda/moe_gemm_sm1xx: upload_weights_sm1xx + run_moe_gemm_sm1xx): the CUTLASS
//    block-scaled NVFP4 grouped GEMMs of sm_100a / sm_120a, W4A4 (activations quantized to
//    NVFP4 per call, with the checkpoint's static input_scale as their global when it has one). Each bucket's config: tuner::pick_moe_gemm among the family's configs
//    that fit the device's shared memory. COMPILED, NOT RUN (no Blackwell GPU has executed it).
//  - Generic (generic_nvfp4_grouped_gemm.hpp): linear checkpoint layout, any shape/arch.
// All read the expert offsets on the device and need no host sync: graph-capturable.
// Auto = the family of the device's compute capability (tuner/moe_gemm_family.hpp) when the
// shape fits it, else Generic. The environment variable FP4MOE_MOE_GEMM=generic|sm90|sm1xx
// overrides Auto (read at upload, not per call).
#include "moe/expert_gemm.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "cuda/moe_gemm_sm1xx/moe_gemm_sm1xx.hpp"
#include "tuner/model_plan.hpp"
#include "tuner/moe_gemm_family.hpp"
#include "tuner/plan_cache.hpp"

namespace fp4moe {

const char* moe_gemm_path_name(MoeGemmPath p) {
  switch (p) {
    case MoeGemmPath::Auto: return "auto";
    case MoeGemmPath::Generic: return "generic";
    case MoeGemmPath::Sm90: return "sm90";
    case MoeGemmPath::Sm1xx: return "sm1xx";
  }
  return "?";
}

MoeGemmPath moe_gemm_path_from_name(std::string_view s, std::string_view what) {
  for (MoeGemmPath p : {MoeGemmPath::Auto, MoeGemmPath::Generic, MoeGemmPath::Sm90, MoeGemmPath::Sm1xx})
    if (s == moe_gemm_path_name(p)) return p;
  FP4MOE_FAIL("{}{}: expected auto, generic, sm90 or sm1xx", what, s);
}

namespace moe {

int tokens_bucket_index(int64_t tokens) {
  return tokens <= 1 ? 0 : int(std::bit_width(uint64_t(tokens - 1)));
}

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

// Expected rows per hit routed expert for `tokens` tokens of `rows_per_token` rows over E
// experts (uniform routing), the last `always_hit` of which take one row per token and are left
// out; the config choice of both tuned paths rests on it.
double routed_rows_per_hit(int64_t tokens, int rows_per_token, int num_experts, int always_hit) {
  const double m = double(std::max<int64_t>(tokens, 1) * rows_per_token);
  const double routed_e = std::max(1, num_experts - always_hit);
  const double routed_m = std::max(0.0, m - double(always_hit) * double(std::max<int64_t>(tokens, 1)));
  const double routed_hit = routed_e * (1.0 - std::pow(1.0 - 1.0 / routed_e, routed_m));
  return routed_m / std::max(routed_hit, 1.0);
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

// What every path's weights share: the shapes, the descriptor, the epilogue uploaded for.
class ExpertGemmCommon : public ExpertGemmWeights {
 protected:
  ExpertGemmCommon(const Stacks& s, cuda::Epilogue ep, int64_t max_tokens, int rows_per_token, bool w4a4) : ep_(ep) {
    bytes_per_expert_ = s.front()->weight_bytes_per_expert();
    n_ = s.front()->n;
    k_ = s.front()->k;
    rows_per_token_ = rows_per_token;
    desc_ = make_desc(s, ep, max_tokens * rows_per_token, w4a4);
    float g = 0.0f;
    for (const ExpertStack* st : s) g = std::max(g, st->input_scale);
    if (w4a4 && g > 0.0f) act_global_ = cuda::DeviceBuffer::from(std::vector<float>{g});
  }
  // W4A4: the checkpoint's static activation global (the largest input_scale of the weight set),
  // or null: the GEMM derives it from the activations' amax on the device per call.
  const float* act_global() const { return act_global_.bytes() ? act_global_.as<float>() : nullptr; }
  cuda::MoeGemmArgs args(const void* x, const int32_t* offsets, const float* row_scale, void* y, int64_t tokens,
                         void* workspace, cudaStream_t stream) const {
    cuda::MoeGemmArgs a = make_args(x, offsets, row_scale, y, tokens * rows_per_token_, workspace, stream);
    a.act_global_scale = act_global();
    return a;
  }
  void check_epilogue(cuda::Epilogue ep) const { FP4MOE_CHECK(ep == ep_, "expert GEMM: uploaded for another epilogue"); }
  // The tokens bucket of a call (checked against the `buckets` planned at upload).
  size_t bucket_of(int64_t tokens, size_t buckets) const {
    const int b = tokens_bucket_index(tokens);
    FP4MOE_CHECK(tokens >= 0 && b < int(buckets), "expert GEMM: {} tokens above the upload's maximum", tokens);
    return size_t(b);
  }

  cuda::Epilogue ep_;
  cuda::MoeGemmDesc desc_;
  cuda::DeviceBuffer act_global_;  // [1] FP32, or empty
};

class GenericExpertGemm final : public ExpertGemmCommon {
 public:
  GenericExpertGemm(const Stacks& s, cuda::Epilogue ep, int64_t max_tokens, int rows_per_token)
      : ExpertGemmCommon(s, ep, max_tokens, rows_per_token, false), dev_(s) {
    const std::string why = cuda::generic_can_implement(desc_, dev_.view());
    FP4MOE_CHECK(why.empty(), "expert GEMM [{}, {}, {}]: {}", desc_.num_experts, n_, k_, why);
  }
  void run(cuda::Epilogue ep, const void* x, const int32_t* offsets, const float* row_scale, void* y, int64_t tokens,
           void* workspace, cudaStream_t stream) const override {
    check_epilogue(ep);
    cuda::run_generic_grouped_gemm(
        desc_, dev_.view(), make_args(x, offsets, row_scale, y, tokens * rows_per_token_, workspace, stream));
  }
  size_t workspace_bytes() const override { return 0; }
  std::string describe() const override { return "generic " + cuda::to_string(cuda::generic_tile_config()); }
  std::string config_for(int64_t) const override { return describe(); }

 private:
  cuda::DeviceLinearFp4Weights dev_;
};

class Sm90ExpertGemm final : public ExpertGemmCommon {
 public:
  Sm90ExpertGemm(const Stacks& s, cuda::Epilogue ep, int64_t max_tokens, int rows_per_token, int always_hit, bool w4a4,
                 cuda::StagedUpload* staging)
      : ExpertGemmCommon(s, ep, max_tokens, rows_per_token, w4a4), always_hit_(always_hit) {
    const std::vector<cuda::TileConfig> cands = cuda::candidate_configs(desc_);
    FP4MOE_CHECK(!cands.empty(), "sm90 expert GEMM: no config for [{}, {}, {}]", desc_.num_experts, n_, k_);
    for (const cuda::TileConfig& c : cands) ws_bytes_ = std::max(ws_bytes_, cuda::workspace_bytes(desc_, c));
    dev_ = cuda::upload_weights_concat(s, ep, nullptr, staging);
    // Every bucket's config, once: bucket b runs min(2^b, max_tokens) tokens at most.
    for (int b = 0; b <= tokens_bucket_index(max_tokens); ++b) {
      const int64_t tokens = std::min<int64_t>(int64_t(1) << b, max_tokens);
      Plan p;
      p.routed = pick(tokens);
      p.shared = shared_config(tokens, p.routed);
      plans_.push_back(p);
    }
  }
  void run(cuda::Epilogue ep, const void* x, const int32_t* offsets, const float* row_scale, void* y, int64_t tokens,
           void* workspace, cudaStream_t stream) const override {
    check_epilogue(ep);
    const Plan& p = plans_[bucket_of(tokens, plans_.size())];
    cuda::MoeGemmArgs a = args(x, offsets, row_scale, y, tokens, workspace, stream);
    if (p.shared) {
      // Folded shared pieces hold one row per token: a decode tile narrower than the batch
      // would re-read their weights once per tile, so they get a wide tile of their own
      // (same weights, same offsets, same workspace: two launches back to back).
      a.expert_end = desc_.num_experts - always_hit_;
      cuda::run_moe_gemm(desc_, p.routed, dev_, a);
      a.expert_begin = a.expert_end;
      a.expert_end = -1;
      cuda::run_moe_gemm(desc_, *p.shared, dev_, a);
      return;
    }
    cuda::run_moe_gemm(desc_, p.routed, dev_, a);
  }
  size_t workspace_bytes() const override { return ws_bytes_; }
  std::string describe() const override { return "sm90 (config per tokens bucket)"; }
  std::string config_for(int64_t tokens) const override {
    const int b = std::min(tokens_bucket_index(tokens), int(plans_.size()) - 1);
    const Plan& p = plans_[size_t(b)];
    return p.shared ? cuda::to_string(p.routed) + " + shared " + cuda::to_string(*p.shared) : cuda::to_string(p.routed);
  }

 private:
  struct Plan {
    cuda::TileConfig routed;
    std::optional<cuda::TileConfig> shared;  // the folded pieces' own launch
  };

  // The folded shared pieces' own config when the routed config's token tile is narrower
  // than the batch (decode kernel at more tokens than its tile), else none.
  std::optional<cuda::TileConfig> shared_config(int64_t tokens, const cuda::TileConfig& routed) const {
    if (always_hit_ == 0 || routed.kernel != cuda::GemmKernel::Sm90Decode || tokens <= routed.block_n)
      return std::nullopt;
    return cuda::default_config(desc_, double(tokens));
  }

  // The tuned tactic of this bucket when the plan cache has one (for the folded set: its
  // own entry, else the routed-only problem's), else the kernel's default for the expected
  // rows per hit routed expert (routed rows spread uniformly over the routed experts; the
  // always-hit experts' one row per token is left out).
  cuda::TileConfig pick(int64_t tokens) const {
    for (int attempt = 0; attempt < (always_hit_ > 0 ? 2 : 1); ++attempt) {
      cuda::MoeGemmDesc d = desc_;
      int top_k = rows_per_token_;
      if (attempt == 1) {  // the routed experts alone, as `fp4moe tune` measures them
        d.num_experts -= always_hit_;
        top_k -= always_hit_;
      }
      const cuda::TileConfig c = tuner::plan_for(d, tokens, top_k);
      if ((c.kernel == cuda::GemmKernel::Sm90Wgmma || c.kernel == cuda::GemmKernel::Sm90Decode) &&
          cuda::can_implement(desc_, c, 90).empty())
        return c;
    }
    // The routed experts' tile; folded shared pieces get their own launch when they would not
    // fit it (shared_config).
    return cuda::default_config(desc_, routed_rows_per_hit(tokens, rows_per_token_, desc_.num_experts, always_hit_));
  }

  cuda::DeviceExpertWeights dev_;
  int always_hit_ = 0;
  size_t ws_bytes_ = 0;
  std::vector<Plan> plans_;  // by tokens bucket index
};

// The Blackwell path (compiled, not run): W4A4, the CUTLASS block-scaled grouped GEMMs.
class Sm1xxExpertGemm final : public ExpertGemmCommon {
 public:
  Sm1xxExpertGemm(const Stacks& s, cuda::Epilogue ep, int64_t max_tokens, int rows_per_token, int always_hit,
                  const tuner::ArchInfo& arch, const std::vector<tuner::FamilyConfig>& family)
      : ExpertGemmCommon(s, ep, max_tokens, rows_per_token, true), arch_(arch) {
    const tuner::GemmProblem prob = tuner::problem_of(desc_, rows_per_token);
    for (int b = 0; b <= tokens_bucket_index(max_tokens); ++b) {
      const int64_t tokens = std::min<int64_t>(int64_t(1) << b, max_tokens);
      const double r = routed_rows_per_hit(tokens, rows_per_token, desc_.num_experts, always_hit);
      tuner::Tactic t = tuner::pick_moe_gemm(prob, arch_, r, nullptr);
      // The decode recipe's per-expert slabs take E x tokens rows of workspace: decode batches only.
      if (t.kernel == cuda::GemmKernel::Sm100MoeDecodeBlockScaled && tokens > kMaxSlabTokens) t = grouped_covering(family, r);
      if (std::none_of(family.begin(), family.end(), [&](const tuner::FamilyConfig& f) { return f.tactic == t; }))
        t = family.front().tactic;
      Plan p{sm1xx_config_of(t), int(tokens)};  // slab depth: no expert gets more rows than tokens
      const std::string why = cuda::sm1xx_can_implement(desc_, p.cfg, arch_.cc, p.depth);
      FP4MOE_CHECK(why.empty(), "sm1xx expert GEMM [{}, {}, {}], {} tokens: {}", desc_.num_experts, n_, k_, tokens, why);
      ws_bytes_ = std::max(ws_bytes_, size_t(cuda::sm1xx_workspace_layout(desc_, p.cfg, arch_.sm_count, p.depth).total));
      plans_.push_back(p);
    }
    dev_ = cuda::upload_weights_sm1xx(s);
  }
  void run(cuda::Epilogue ep, const void* x, const int32_t* offsets, const float* row_scale, void* y, int64_t tokens,
           void* workspace, cudaStream_t stream) const override {
    check_epilogue(ep);
    const Plan& p = plans_[bucket_of(tokens, plans_.size())];
    // No static input_scale: the activations' global is amax / 2688 computed on the device.
    cuda::run_moe_gemm_sm1xx(desc_, p.cfg, dev_, args(x, offsets, row_scale, y, tokens, workspace, stream), p.depth);
  }
  size_t workspace_bytes() const override { return ws_bytes_; }
  std::string describe() const override { return arch_.name + " sm1xx W4A4 (config per tokens bucket; compiled, not run)"; }
  std::string config_for(int64_t tokens) const override {
    return plans_[size_t(std::min(tokens_bucket_index(tokens), int(plans_.size()) - 1))].cfg.name();
  }

  static constexpr int64_t kMaxSlabTokens = 32;  // 95 MB of slabs for GLM-5's gate_up at 32 tokens

  // The narrowest grouped (non-slab) token tile of the family that covers r rows, else the widest.
  static tuner::Tactic grouped_covering(const std::vector<tuner::FamilyConfig>& family, double r) {
    std::optional<tuner::Tactic> best;
    for (const tuner::FamilyConfig& f : family) {
      const tuner::Tactic& t = f.tactic;
      if (t.kernel == cuda::GemmKernel::Sm100MoeDecodeBlockScaled) continue;
      const bool covers = t.block_n >= r, best_covers = best && best->block_n >= r;
      if (!best || (covers && (!best_covers || t.block_n < best->block_n)) || (!covers && !best_covers && t.block_n > best->block_n))
        best = t;
    }
    return best ? *best : family.front().tactic;
  }

  // The kernels' config for a tactic of the tuner's Blackwell registry.
  static cuda::Sm1xxConfig sm1xx_config_of(const tuner::Tactic& t) {
    namespace bs = cuda::sm1xx;
    bs::BsRecipe r = bs::BsRecipe::Sm120Grouped;
    switch (t.kernel) {
      case cuda::GemmKernel::Sm120MmaBlockScaled: r = bs::BsRecipe::Sm120Grouped; break;
      case cuda::GemmKernel::Sm100Tcgen05BlockScaled:
        r = t.cluster == 2 ? bs::BsRecipe::Sm100Grouped2Sm : bs::BsRecipe::Sm100Grouped1Sm;
        break;
      case cuda::GemmKernel::Sm100MoeDecodeBlockScaled: r = bs::BsRecipe::Sm100MoeDecode; break;
      default: FP4MOE_FAIL("sm1xx expert GEMM: {} is not a Blackwell block-scaled tactic", cuda::to_string(t));
    }
    return {r, t.block_m, t.block_n, t.block_k};
  }

 private:
  struct Plan {
    cuda::Sm1xxConfig cfg;
    int depth = 0;  // max rows per expert of the bucket (the decode recipe's slab depth)
  };
  cuda::DeviceBsWeights dev_;
  tuner::ArchInfo arch_;
  size_t ws_bytes_ = 0;
  std::vector<Plan> plans_;  // by tokens bucket index
};

struct Resolved {
  MoeGemmPath path = MoeGemmPath::Generic;
  tuner::ArchInfo arch;                      // the device's (Sm1xx only)
  std::vector<tuner::FamilyConfig> configs;  // the family's configs that fit it (Sm1xx only)
};

// The path: forced (argument, else FP4MOE_MOE_GEMM), else the family of the device's arch
// (tuner::select_moe_gemm_family, the one arch -> kernel table), else Generic.
Resolved resolve(MoeGemmPath want, const Stacks& s, cuda::Epilogue ep, int64_t max_rows, int top_k, bool w4a4) {
  if (const char* env = std::getenv("FP4MOE_MOE_GEMM"); env && *env && want == MoeGemmPath::Auto)
    want = moe_gemm_path_from_name(env, "FP4MOE_MOE_GEMM=");
  const cuda::MoeGemmDesc d = make_desc(s, ep, max_rows, w4a4);
  Resolved out;
  if (want == MoeGemmPath::Generic || want == MoeGemmPath::Sm90) {
    out.path = want;
    return out;
  }
  out.arch = tuner::device_arch(cuda::current_device_ordinal());
  const tuner::FamilyChoice fc =
      tuner::select_moe_gemm_family(out.arch, tuner::problem_of(d, top_k), tuner::compiled_cuda_archs(), w4a4);
  if (want == MoeGemmPath::Sm1xx)
    FP4MOE_CHECK(fc.family == tuner::MoeGemmFamily::Sm1xx, "expert GEMM [{}, {}, {}]: the sm1xx path cannot run here: {}",
                 d.num_experts, d.n, d.k, fc.why);
  switch (fc.family) {
    case tuner::MoeGemmFamily::None:
      FP4MOE_FAIL("expert GEMM [{}, {}, {}]: {}", d.num_experts, d.n, d.k, fc.why);
    case tuner::MoeGemmFamily::Generic:
      log_debug("expert GEMM [{}, {}, {}]: {}", d.num_experts, d.n, d.k, fc.why);
      out.path = w4a4 ? MoeGemmPath::Sm90 : MoeGemmPath::Generic;  // W4A4 emulation: sm90 says why it cannot
      return out;
    case tuner::MoeGemmFamily::Sm1xx:
      out.path = MoeGemmPath::Sm1xx;
      out.configs = fc.configs;
      return out;
    case tuner::MoeGemmFamily::Sm90: break;
  }
  if (w4a4) {
    out.path = MoeGemmPath::Sm90;  // the only path with the W4A4 emulation
    return out;
  }
  const std::vector<cuda::TileConfig> cands = cuda::candidate_configs(d);
  const std::string why = cands.empty() ? std::string("no candidate config")
                                        : cuda::can_implement(d, cands.front(), out.arch.cc);
  if (!why.empty()) log_debug("expert GEMM [{}, {}, {}]: sm90 path not used: {}", d.num_experts, d.n, d.k, why);
  out.path = why.empty() ? MoeGemmPath::Sm90 : MoeGemmPath::Generic;
  return out;
}

}  // namespace

std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const std::vector<const ExpertStack*>& stacks,
                                                      cuda::Epilogue epilogue, int64_t max_tokens, int rows_per_token,
                                                      int always_hit, MoeGemmPath path, bool w4a4,
                                                      cuda::StagedUpload* staging) {
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
  FP4MOE_CHECK(rows_per_token >= 1 && always_hit >= 0 && always_hit < rows_per_token && always_hit < E,
               "expert GEMM: rows_per_token {} / always_hit {} / {} experts", rows_per_token, always_hit, E);
  FP4MOE_CHECK(max_tokens >= 1 && max_tokens * rows_per_token < (int64_t(1) << 31),
               "expert GEMM: max_tokens = {} x {} rows per token", max_tokens, rows_per_token);
  const Resolved r = resolve(path, stacks, epilogue, max_tokens * rows_per_token, rows_per_token, w4a4);
  const MoeGemmPath p = r.path;
  FP4MOE_CHECK(!(w4a4 && p == MoeGemmPath::Generic), "expert GEMM: W4A4 emulation needs the sm90 or sm1xx path");
  if (p == MoeGemmPath::Sm90)
    return std::make_unique<Sm90ExpertGemm>(stacks, epilogue, max_tokens, rows_per_token, always_hit, w4a4, staging);
  // The other paths upload the owned layout: view-mode stacks get an owned copy first.
  std::vector<ExpertStack> owned;
  owned.reserve(stacks.size());
  Stacks s;
  for (const ExpertStack* x : stacks) {
    if (!x->is_view()) {
      s.push_back(x);
      continue;
    }
    owned.push_back(owned_expert_stack(*x));
    s.push_back(&owned.back());
  }
  if (p == MoeGemmPath::Sm1xx)
    return std::make_unique<Sm1xxExpertGemm>(s, epilogue, max_tokens, rows_per_token, always_hit, r.arch, r.configs);
  return std::make_unique<GenericExpertGemm>(s, epilogue, max_tokens, rows_per_token);
}

}  // namespace moe
}  // namespace fp4moe
