// Tactics: one way to run an op = an implementation x a config. Each op has a registry of
// tactics; each tactic says up front whether it can run a problem on an architecture, and
// if not, why (in bytes, for shared memory).
//
// The problem and config types mirror cuda::MoeGemmDesc / cuda::TileConfig / cuda::GemmKernel
// (src/cuda/moe_gemm/moe_gemm.hpp) so that feasibility, the plan cache and `tune --dry-run`
// build without CUDA (and list the Blackwell tactics no GPU here can run). tactic_cuda.hpp is
// the one converter between the two: the profiler and the MoE layer's plan lookup use it.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/moe_layer.hpp"
#include "tuner/arch.hpp"
#include "tuner/smem_plan.hpp"

namespace fp4moe::tuner {

enum class Act : uint8_t { BF16, NVFP4 };                 // cuda::ActFormat: W4A16 or W4A4
enum class Epi : uint8_t { None, SiluMul, RowScale };     // cuda::Epilogue

std::string_view act_name(Act a);       // "bf16" | "nvfp4"
std::string_view epi_name(Epi e);       // "none" | "silu_mul" | "row_scale"
std::optional<Act> act_from_name(std::string_view s);
std::optional<Epi> epi_from_name(std::string_view s);
std::optional<WeightFormat> weight_from_name(std::string_view s);

// What must be computed: a grouped GEMM over E experts, y[m, :] = x[m, :] . W_e^T.
struct GemmProblem {
  int num_experts = 0;
  int n = 0;          // output features (2I for gate_up)
  int k = 0;          // reduction dim
  int top_k = 8;      // experts per token (turns tokens into rows: M_total = tokens * top_k)
  WeightFormat weight = WeightFormat::NVFP4;
  Act act = Act::BF16;
  Epi epilogue = Epi::None;
  std::string label;  // "gate_up", "down" (for reports only; not part of the plan key)
};
std::string to_string(const GemmProblem& p);  // "gate_up N=4096 K=6144 E=256 nvfp4 w4a16 silu_mul"

enum class Impl : uint8_t {
  Sm90Wgmma,              // cuda::GemmKernel::Sm90Wgmma
  Sm90Decode,             // cuda::GemmKernel::Sm90Decode
  DequantCublas,          // cuda::GemmKernel::DequantCublas (the baseline)
  Generic,                // cuda::GemmKernel::Generic (the fallback: any shape, any arch)
  Sm100Tcgen05BlockScaled,  // listed only: CUTLASS-like tcgen05 kind::mxf4nvf4 kernel (sm_100/103)
  Sm120MmaBlockScaled,      // listed only: CUTLASS-like mma.sync block_scale kernel (sm_120/121)
};
std::string_view impl_name(Impl i);     // "sm90-wgmma", "sm90-decode", "dequant-cublas", "generic",
                                        // "sm100-tcgen05-bs", "sm120-mma-bs"
std::optional<Impl> impl_from_name(std::string_view s);
bool impl_is_listed_only(Impl i);       // Blackwell tactics: feasibility only, never launched here

// How it is computed (cuda::TileConfig without the kernel).
struct TileCfg {
  int block_m = 0;   // sm90: weight rows (GEMM N) per CTA; Blackwell listings: CUTLASS tile M (tokens)
  int block_n = 0;   // sm90: tokens per CTA;                Blackwell listings: CUTLASS tile N (weight rows)
  int block_k = 0;   // elements along K
  int stages = 0;
  int split_k = 1;
  int cluster = 1;
  bool operator==(const TileCfg&) const = default;
};

struct Tactic {
  Impl impl = Impl::Generic;
  TileCfg cfg;
  bool operator==(const Tactic&) const = default;
  std::string name() const;  // "sm90-wgmma 128x64x128 s4", "generic", "sm120-mma-bs 128x256x256 s2"
};
std::ostream& operator<<(std::ostream&, const Tactic&);

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
  Impl impl;
  std::string kernel;  // hash of the kernel's source files
  std::string layout;  // hash of its weight layout's source files ("checkpoint-linear": the checkpoint's)
};
std::vector<KernelIdentity> kernel_identities(std::string_view op);
// One short hex string (FNV-1a 64) over every identity in order: the plan cache's `kernels` key.
std::string registry_key(const std::vector<KernelIdentity>& ids);

// Internal: the moe-gemm registry (moe_gemm_tactics.cpp).
std::vector<TacticDef> moe_gemm_tactics(const GemmProblem& p);

}  // namespace fp4moe::tuner
