// The whole model's kernel plan on one architecture, chosen at start-up from the arch alone (no
// measurement): which kernel runs every GEMM, the attention and the indexer, and why, with the
// numbers the choice rests on (the CUTLASS types' shared memory for the Blackwell GEMMs, the
// kernels' own SharedStorage for the Blackwell MLA). `fp4moe tune --arch sm_XX --dry-run` prints
// it; after `fp4moe tune` has measured on the device, the plan cache overrides the MoE GEMM picks.
// Blackwell entries are compiled, not run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "format/checkpoint.hpp"
#include "tuner/arch.hpp"
#include "tuner/tactic.hpp"

namespace fp4moe::tuner {

struct ModelPlanEntry {
  std::string part;    // "routed experts gate_up, T=1"
  std::string kernel;  // "sm120-mma-bs 128x32x256 s3" / "FlashInfer MLA (attention/mla.cuh)"
  std::string why;     // one or two sentences with the numbers
  bool runs = true;    // false: nothing in this build can run the part on this arch
};

struct ModelPlan {
  std::string arch, model;
  std::vector<ModelPlanEntry> entries;
};

// GLM-5's dimensions (the glm5 preset of `fp4moe tune`).
ModelConfig glm5_config();

// The plan for `cfg` on `arch` at the given token counts (decode batches and a prefill chunk).
// Routed experts run W4A4 when the checkpoint quantizes their activations (input_scale):
// w4a4 = true for NVIDIA's GLM-5-NVFP4.
ModelPlan plan_model(const ArchInfo& arch, const ModelConfig& cfg, const std::vector<int64_t>& tokens, bool w4a4);

// The MoE GEMM pick alone: the best feasible, built tactic for `rows_per_expert` rows per hit
// expert on `arch`, by the rule each kernel family was designed for (no measurement). Returns the
// fallback when nothing else can run. `why` gets the reason.
Tactic pick_moe_gemm(const GemmProblem& p, const ArchInfo& arch, double rows_per_expert, std::string* why);

// Expected rows per hit expert for T tokens over E experts, top-k (uniform routing).
double rows_per_hit_expert(int64_t tokens, int experts, int top_k);

std::string format_model_plan(const ModelPlan& plan);
nlohmann::json model_plan_json(const ModelPlan& plan);

}  // namespace fp4moe::tuner
