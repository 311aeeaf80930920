// Tactics: one way to run an op = an implementation x a config. Each op has a registry of
// tactics; each tactic says up front whether it can run a problem on an architecture, and
// if not, why (in bytes, for shared memory).
//
// A tactic IS a cuda::TileConfig (kernel + tile) and the formats and epilogues are the kernels'
// own enums (cuda/moe_gemm/moe_gemm_types.hpp, plain C++: feasibility, the plan cache and
// `tune --dry-run` build without CUDA and list Blackwell kernels no GPU here runs). The tuner's
// problem, GemmProblem, is a MoeGemmDesc's shapes and formats plus the routing (top_k) instead of
// workspace sizing; problem_of / desc_of below convert between the two, the one place that does.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/moe_gemm/moe_gemm_types.hpp"
#include "format/moe_layer.hpp"
#include "tuner/arch.hpp"
#include "tuner/smem_plan.hpp"

namespace fp4moe::tuner {

using cuda::ActFormat;   // BF16: W4A16; NVFP4_EMULATED: W4A4 (named "w4a4" / "nvfp4" here)
using cuda::Epilogue;
using cuda::GemmKernel;

std::string_view act_name(ActFormat a);     // "bf16" | "nvfp4"
std::string_view epi_name(Epilogue e);      // "none" | "silu_mul" | "row_scale"
std::optional<ActFormat> act_from_name(std::string_view s);   // also "w4a16" / "w4a4"
std::optional<Epilogue> epi_from_name(std::string_view s);
std::optional<WeightFormat> weight_from_name(std::string_view s);

// What must be computed: a grouped GEMM over E experts, y[m, :] = x[m, :] . W_e^T.
struct GemmProblem {
  int num_experts = 0;
  int n = 0;          // output features (2I for gate_up)
  int k = 0;          // reduction dim
  int top_k = 8;      // experts per token (turns tokens into rows: M_total = tokens * top_k)
  WeightFormat weight = WeightFormat::NVFP4;
  ActFormat act = ActFormat::BF16;
  Epilogue epilogue = Epilogue::None;
  std::string label;  // "gate_up", "down" (for reports only; not part of the plan key)
};
std::string to_string(const GemmProblem& p);  // "gate_up N=4096 K=6144 E=256 nvfp4 w4a16 silu_mul"
// The one converter between the tuner's problem and the kernels' descriptor.
GemmProblem problem_of(const cuda::MoeGemmDesc& d, int top_k);
cuda::MoeGemmDesc desc_of(const GemmProblem& p, int max_tokens);

std::string_view impl_name(GemmKernel i);   // "sm90-wgmma", "sm90-decode", "dequant-cublas", "generic",
                                            // "sm100-tcgen05-bs", "sm120-mma-bs"
std::optional<GemmKernel> impl_from_name(std::string_view s);
bool impl_is_listed_only(GemmKernel i);     // Blackwell tactics: feasibility only, never launched here

// A tactic: a kernel and its tile (block_m / block_n / block_k, stages, split_k, cluster).
using Tactic = cuda::TileConfig;
std::string tactic_name(const Tactic& t);  // "sm90-wgmma 128x64x128 s4", "generic", "sm120-mma-bs 128x256x256 s2"

// Why a tactic cannot run, by kind, so reports can group them.
enum class RejectKind : uint8_t {
  Arch,          // the instructions do not exist on this architecture
  Numerics,      // computes other numerics than the problem asks (W4A4 vs W4A16) or formats
  Shape,         // N / K / block sizes
  SharedMemory,  // does not fit the per-block shared memory
  Registers,     // register / tensor-memory / thread budget
};
std::string_view reject_kind_name(RejectKind k);  // "arch", "numerics", ...

struct Reason {
  RejectKind kind;
  std::string text;  // one sentence with the numbers
};

struct Feasibility {
  bool ok = true;
  std::vector<Reason> reasons;           // why not
  std::optional<SmemPlan> smem;          // the term-by-term shared memory, when it applies
  std::vector<std::string> notes;        // caveats that do not reject (e.g. "needs host counts")
  void reject(RejectKind kind, std::string why) {
    ok = false;
    reasons.push_back({kind, std::move(why)});
  }
  bool rejected_for(RejectKind k) const;
  bool only_rejected_for(RejectKind k) const;  // rejected, and every reason is of kind k
  std::string reason() const;            // reasons joined by "; "
};

struct TacticDef {
  Tactic tactic;
  std::function<Feasibility(const GemmProblem&, const ArchInfo&)> valid;
};

// The ops the tuner knows ("moe-gemm").
std::vector<std::string> known_ops();
// Every tactic of `op` for this problem (feasible or not), our kernels first, the baseline,
// the fallback, then the listed Blackwell ones. Throws for an unknown op.
std::vector<TacticDef> tactics_for(std::string_view op, const GemmProblem& p);
// The tactic that accepts any shape on any architecture the engine runs on (Generic). Always exists.
Tactic fallback_tactic(std::string_view op);

// What a measured plan depends on besides the GPU: each implementation's kernel code and the
// layout of the weights it reads. The ids are hashes of the defining source files, made at
// configure time (src/tuner/CMakeLists.txt -> kernel_ids.hpp); listed-only tactics have none.
struct KernelIdentity {
  GemmKernel gemm;
  std::string kernel_id;  // hash of the kernel's source files
  std::string layout_id;  // hash of its weight layout's source files ("checkpoint-linear": the checkpoint's)
};
std::vector<KernelIdentity> kernel_identities(std::string_view op);
// One short hex string (FNV-1a 64) over every identity in order: the plan cache's `kernels` key.
std::string registry_key(const std::vector<KernelIdentity>& ids);

// Internal: the moe-gemm registry (moe_gemm_tactics.cpp).
std::vector<TacticDef> moe_gemm_tactics(const GemmProblem& p);

}  // namespace fp4moe::tuner
