// The whole model's kernel plan by architecture (model_plan.hpp). Blackwell entries: compiled,
// not run.
#include "tuner/model_plan.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "tuner/attention_plan.hpp"
#include "tuner/moe_gemm_family.hpp"
#include "tuner/sm1xx_tactics.hpp"

#if defined(FP4MOE_HAVE_SM100) || defined(FP4MOE_HAVE_SM120)
#include "cuda/attention/sm1xx_mla_fa2.hpp"
#endif

namespace fp4moe::tuner {

ModelConfig glm5_config() {
  ModelConfig c;
  c.architecture = "GlmMoeDsaForCausalLM";
  c.model_type = "glm_moe_dsa";
  c.hidden_size = 6144;
  c.num_layers = 78;
  c.vocab_size = 154880;
  c.first_k_dense_replace = 3;
  c.num_attention_heads = 64;
  c.q_lora_rank = 2048;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 192;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  c.n_shared_experts = 1;
  c.moe.hidden = 6144;
  c.moe.inter = 2048;
  c.moe.num_experts = 256;
  c.moe.top_k = 8;
  c.moe.shared_inter = 2048;
  return c;
}

double rows_per_hit_expert(int64_t tokens, int experts, int top_k) {
  if (tokens <= 0 || experts <= 0 || top_k <= 0) return 0.0;
  const double hit = double(experts) * (1.0 - std::pow(1.0 - double(top_k) / experts, double(tokens)));
  return double(tokens) * top_k / std::max(hit, 1.0);
}

namespace {

struct Option {
  Tactic tactic;
  Feasibility f;
};

std::vector<Option> feasible(const GemmProblem& p, const ArchInfo& a, GemmKernel kernel) {
  std::vector<Option> out;
  for (const TacticDef& d : tactics_for("moe-gemm", p))
    if (d.tactic.kernel == kernel)
      if (Feasibility f = d.valid(p, a); f.ok) out.push_back({d.tactic, std::move(f)});
  // Narrowest token tile first; for one tile the deepest pipeline first.
  std::sort(out.begin(), out.end(), [](const Option& x, const Option& y) {
    if (x.tactic.block_n != y.tactic.block_n) return x.tactic.block_n < y.tactic.block_n;
    if (x.tactic.cluster != y.tactic.cluster) return x.tactic.cluster > y.tactic.cluster;
    return x.tactic.stages > y.tactic.stages;
  });
  return out;
}

// The narrowest token tile that covers r rows, else the widest.
const Option& covering(const std::vector<Option>& v, double r) {
  for (const Option& o : v)
    if (o.tactic.block_n >= r) return o;
  return v.back();
}

std::string smem_words(const Option& o, const ArchInfo& a) {
  return o.f.smem ? fmt::format("{} of {}'s {} B shared memory", with_commas(o.f.smem->total()), a.name,
                                with_commas(a.smem_per_block_optin))
                  : std::string("no shared-memory figure");
}

}  // namespace

Tactic pick_moe_gemm(const GemmProblem& p, const ArchInfo& a, double r, std::string* why) {
  auto done = [&](const Option& o, const std::string& rule) {
    if (why) *why = fmt::format("{}; {}", rule, smem_words(o, a));
    return o.tactic;
  };
  if (const auto moe = feasible(p, a, GemmKernel::Sm100MoeDecodeBlockScaled); !moe.empty() && r <= 64)
    return done(covering(moe, r),
                fmt::format("{:.1f} rows per hit expert: CUTLASS example 92's decode recipe streams the weights by TMA "
                            "and the few activation rows by cp.async (no per-expert TMA descriptor updates)",
                            r));
  if (const auto tc = feasible(p, a, GemmKernel::Sm100Tcgen05BlockScaled); !tc.empty()) {
    if (r >= 128)
      for (const Option& o : tc)
        if (o.tactic.cluster == 2 && o.tactic.block_n >= 128)
          return done(o, fmt::format("{:.0f} rows per hit expert fill 128-token tiles: the 2-SM tile (256 weight "
                                     "rows over a CTA pair) halves the B traffic per MMA",
                                     r));
    std::vector<Option> one;
    for (const Option& o : tc)
      if (o.tactic.cluster == 1) one.push_back(o);
    if (!one.empty())
      return done(covering(one, r), fmt::format("{:.1f} rows per hit expert: the narrowest 1-SM token tile that covers them", r));
  }
  if (const auto mma = feasible(p, a, GemmKernel::Sm120MmaBlockScaled); !mma.empty())
    return done(covering(mma, r),
                fmt::format("{:.1f} rows per hit expert: the narrowest built token tile that covers them wastes the "
                            "least MMA work (tile M is 128 weight rows)",
                            r));
  if (const auto dec = feasible(p, a, GemmKernel::Sm90Decode); !dec.empty() && r <= 24)
    return done(dec.front(), fmt::format("{:.1f} rows per hit expert (<= 24): the mma.sync weight-streaming kernel, "
                                         "block_n 8 (measured fastest per byte on the H200, bench/RESULTS.md)",
                                         r));
  if (const auto wg = feasible(p, a, GemmKernel::Sm90Wgmma); !wg.empty())
    return done(covering(wg, r), fmt::format("{:.0f} rows per hit expert: the wgmma kernel's narrowest block_n that "
                                             "covers them, deepest pipeline",
                                             r));
  if (why)
    *why = p.act == ActFormat::NVFP4_EMULATED && a.block_scaled_mma && !sm1xx_facts_available()
               ? "no block-scaled kernel in this build (" + sm1xx_absence_reason() + "); the Generic fallback"
               : "nothing faster can run here: the Generic fallback (any shape, any arch, W4A16 numerics)";
  return fallback_tactic("moe-gemm");
}

namespace {

struct MlaFa2SmemRow {
  int stages = 0, kv_tile = 0;
  int64_t bf16_bytes = 0;
  int fp8_kv_tile = 0;
  int64_t fp8_bytes = 0;
};

// The MLA entries (dense decode, sparse decode, prefill) for this arch.
void add_attention(ModelPlan& plan, const ArchInfo& a, const ModelConfig& c) {
  const std::string heads = fmt::format("{} heads, latent {} + rope {}", c.num_attention_heads, c.kv_lora_rank,
                                        c.qk_rope_head_dim);
  if (a.cc == 90) {
    plan.entries.push_back({"MLA decode / sparse decode (DSA)", "FlashInfer SM90 MLA (attention/mla_hopper.cuh) via MlaSm90",
                            fmt::format("wgmma + TMA, BF16 or FP8 KV ({}); sparse rows: page_size 1 with the top-{} "
                                        "slots as the page table. What the GPU runner runs: its attention plan's "
                                        "entries below",
                                        heads, c.index_topk)});
    plan.entries.push_back({"MLA prefill", "expanded form: FlashInfer FA3 ragged prefill (256/256) via MlaPrefillExpandedSm90",
                            "kv_b_proj expands K/V per head (cuBLAS), then causal FA3; the absorbed MlaSm90 for short chunks"});
    return;
  }
  const bool blackwell = a.cc == 100 || a.cc == 120;
  bool built = false;
  MlaFa2SmemRow row{};
#if defined(FP4MOE_HAVE_SM100) || defined(FP4MOE_HAVE_SM120)
  const cuda::attention::MlaFa2SmemTable t = cuda::attention::mla_fa2_smem();
  for (int i = 0; i < t.count; ++i)
    if ((a.cc == 100 && t.rows[i].smem_per_sm > 200000) || (a.cc == 120 && t.rows[i].smem_per_sm < 200000)) {
      const auto& r = t.rows[i];
      row = {r.stages, r.kv_tile, r.bf16_bytes, r.fp8_kv_tile, r.fp8_bytes};
      built = true;
    }
#if !defined(FP4MOE_HAVE_SM100)
  if (a.cc == 100) built = false;
#endif
#if !defined(FP4MOE_HAVE_SM120)
  if (a.cc == 120) built = false;
#endif
#endif
  if (!blackwell || !built) {
    plan.entries.push_back({"MLA attention", "none compiled for " + a.name,
                            blackwell ? "the portable FlashInfer MLA (attention/mla.cuh) is built for sm_100a / sm_120a "
                                        "only when CMAKE_CUDA_ARCHITECTURES has them"
                                      : "MLA kernels are built for sm_90a (FlashInfer SM90) and sm_100a / sm_120a "
                                        "(FlashInfer portable MLA); arch-specific cubins run on that compute capability only",
                            false});
    return;
  }
  const int64_t cap = a.smem_per_block_optin;
  const std::string kernel = "FlashInfer portable MLA (attention/mla.cuh, BatchMLAPagedAttention) via "
                             "sm1xx_mla_flashinfer_fa2_bf16.cu";
  plan.entries.push_back(
      {"MLA decode / sparse decode (DSA)", kernel,
       fmt::format("mma.sync + cp.async, same MLAParams / MLAPlan / paged KV as the SM90 path ({}); BF16 KV: {} stage(s) "
                   "x {} keys, {} of {} B (its SharedStorage type); FP8 KV ({} keys + BF16 repack) needs {} B: {}. "
                   "Sparse rows: page_size 1 with the top-{} slots as the page table. FlashInfer's SM120 sparse MLA "
                   "(attention/sparse_mla_sm120) wants its own 656 B/token FP8 cache rows and its planner is not in the "
                   "wheel's headers: not used. The GPU runner does not use this path yet (its attention plan's entries "
                   "below say what it runs)",
                   heads, row.stages, row.kv_tile, with_commas(row.bf16_bytes), with_commas(cap), row.fp8_kv_tile,
                   with_commas(row.fp8_bytes),
                   row.fp8_bytes <= cap ? "fits" : "does not fit, so this arch keeps a BF16 KV cache", c.index_topk)});
  plan.entries.push_back({"MLA prefill", kernel + " (absorbed, causal)",
                          "the expanded FA3 prefill is wgmma-only (sm_90a); the absorbed form runs the same instantiation"});
}

}  // namespace

ModelPlan plan_model(const ArchInfo& a, const ModelConfig& c, const std::vector<int64_t>& tokens, bool w4a4) {
  FP4MOE_CHECK(c.moe.num_experts > 0 && c.moe.inter > 0 && c.moe.hidden > 0, "model plan: the config has no MoE layer");
  ModelPlan plan;
  plan.arch = a.name;
  plan.model = fmt::format("{}: {} layers ({} dense), hidden {}, {} experts top-{} (intermediate {}), {} heads", c.architecture,
                           c.num_layers, c.first_k_dense_replace, c.hidden_size, c.moe.num_experts, c.moe.top_k,
                           c.moe.inter, c.num_attention_heads);
  const ActFormat act = w4a4 ? ActFormat::NVFP4_EMULATED : ActFormat::BF16;
  const GemmProblem gate_up{int(c.moe.num_experts), int(2 * c.moe.inter), int(c.moe.hidden), int(c.moe.top_k),
                            WeightFormat::NVFP4, act, Epilogue::SiluMul, "gate_up"};
  const GemmProblem down{int(c.moe.num_experts), int(c.moe.hidden), int(c.moe.inter), int(c.moe.top_k),
                         WeightFormat::NVFP4, act, Epilogue::RowScale, "down"};
  {  // the MoE layer's own choice: the arch -> family table, with this binary's architectures
    const FamilyChoice fc = select_moe_gemm_family(a, gate_up, compiled_cuda_archs(), w4a4);
    plan.entries.push_back({fmt::format("MoE GEMM family (MoeLayerCuda, Auto; this binary: {})",
                                        compiled_cuda_archs_text().empty() ? "no CUDA" : compiled_cuda_archs_text()),
                            std::string(family_name(fc.family)), fc.why, fc.family != MoeGemmFamily::None});
  }
  for (int64_t t : tokens) {
    const double r = rows_per_hit_expert(t, gate_up.num_experts, gate_up.top_k);
    for (const GemmProblem& p : {gate_up, down}) {
      std::string why;
      const Tactic pick = pick_moe_gemm(p, a, r, &why);
      plan.entries.push_back({fmt::format("routed experts {} (N {}, K {}), T={}", p.label, p.n, p.k, t), tactic_name(pick), why,
                              true});
    }
  }
  if (w4a4 && a.block_scaled_mma)
    plan.entries.push_back({"routed experts' activations", "nvfp4_act_quant.cu (before each block-scaled GEMM)",
                            "NVFP4 with the checkpoint's static input_scale as the global (the largest of the "
                            "experts'; amax(x) on the device per call without one), scale factors in CUTLASS's 128x4 "
                            "atoms per expert; SiLU·up and the routing weight in its row pass (no C-loading epilogue)"});
  else if (w4a4)
    plan.entries.push_back({"routed experts' activations", "act_quant.cu (W4A4 emulation)",
                            "fake-quantized to NVFP4 with the input_scale, exact in BF16; the W4A16 kernel computes the "
                            "same products"});
  plan.entries.push_back({"router", "routing/ (fused GEMV for T <= 32, tiled SIMT GEMM + warp top-k above)",
                          "plain CUDA, FP32: every arch the build has"});
  plan.entries.push_back({"shared expert, dense MLPs (first " + std::to_string(c.first_k_dense_replace) +
                              " layers), attention and indexer projections, lm_head",
                          "cuBLASLt BF16 GEMM", "BF16 in NVIDIA's checkpoint (only the routed experts are NVFP4); "
                                                "cuBLASLt picks the arch's tensor-core kernels"});
  add_attention(plan, a, c);
  {  // what the GPU runner runs: its attention plan (tuner/attention_plan.hpp), --attention-kernels auto
    AttentionDims d;
    d.heads = c.num_attention_heads, d.kv_lora = c.kv_lora_rank, d.rope = c.qk_rope_head_dim;
    d.softmax_scale = 1.0 / std::sqrt(double(std::max<int64_t>(c.qk_nope_head_dim + c.qk_rope_head_dim, 1)));
    d.indexer = c.index_topk > 0;
    d.index_heads = c.index_n_heads, d.index_dim = c.index_head_dim, d.index_topk = c.index_topk;
    d.dsa_layer.assign(size_t(std::max<int64_t>(c.num_layers, 1)), d.indexer);
    const AttentionPlan ap = plan_attention(a, flashinfer_mla_built(), d, AttentionKernels::Auto);
    for (const AttentionChoice& ch : ap.choices)
      plan.entries.push_back({"GPU runner: " + ch.part, ch.kernel, ch.why, true});
  }
  plan.entries.push_back(
      {fmt::format("DSA indexer ({} x {}, top-{})", c.index_n_heads, c.index_head_dim, c.index_topk),
       "indexer_score_mma + indexer_topk_radix (cuda/indexer)",
       a.cc >= 89 ? fmt::format("mma.sync (BF16 m16n8k16, FP8 E4M3 m16n8k32) + cp.async ring, compiled for every arch of "
                                "the build; the ring drops to 2 stages where the 3-stage BF16 one does not fit ({} B "
                                "per block here)",
                                with_commas(a.smem_per_block_optin))
                  : std::string("needs FP8 mma.sync (sm_89+)"),
       a.cc >= 89});
  plan.entries.push_back({"KV append, permute, combine", "plain CUDA kernels", "every arch the build has"});
  return plan;
}

std::string format_model_plan(const ModelPlan& plan) {
  std::string s = fmt::format("\n== whole-model plan on {} ({})\n", plan.arch, plan.model);
  for (const ModelPlanEntry& e : plan.entries) {
    s += fmt::format("  {}\n    -> {}{}\n", e.part, e.kernel, e.runs ? "" : " (cannot run)");
    if (!e.why.empty()) s += fmt::format("       {}\n", e.why);
  }
  if (plan.arch == "sm_100" || plan.arch == "sm_120")
    s += "  (Blackwell kernels: compiled, not run. After `fp4moe tune` measures on the device, the plan cache "
         "overrides the MoE GEMM picks.)\n";
  return s;
}

nlohmann::json model_plan_json(const ModelPlan& plan) {
  nlohmann::json entries = nlohmann::json::array();
  for (const ModelPlanEntry& e : plan.entries)
    entries.push_back({{"part", e.part}, {"kernel", e.kernel}, {"why", e.why}, {"runs", e.runs}});
  return {{"arch", plan.arch}, {"model", plan.model}, {"entries", entries}};
}

}  // namespace fp4moe::tuner
