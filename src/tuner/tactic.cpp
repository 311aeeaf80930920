#include "tuner/tactic.hpp"


#include <fmt/format.h>

#include "core/error.hpp"
#include "tuner/kernel_ids.hpp"

namespace fp4moe::tuner {

std::string_view act_name(ActFormat a) { return a == ActFormat::BF16 ? "bf16" : "nvfp4"; }

std::string_view epi_name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::SiluMul: return "silu_mul";
    case Epilogue::RowScale: return "row_scale";
  }
  return "?";
}

std::optional<ActFormat> act_from_name(std::string_view s) {
  if (s == "bf16" || s == "w4a16") return ActFormat::BF16;
  if (s == "nvfp4" || s == "w4a4") return ActFormat::NVFP4_EMULATED;
  return std::nullopt;
}

std::optional<Epilogue> epi_from_name(std::string_view s) {
  for (Epilogue e : {Epilogue::None, Epilogue::SiluMul, Epilogue::RowScale})
    if (s == epi_name(e)) return e;
  return std::nullopt;
}

std::optional<WeightFormat> weight_from_name(std::string_view s) {
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4, WeightFormat::BF16})
    if (s == weight_format_name(f)) return f;
  return std::nullopt;
}

std::string to_string(const GemmProblem& p) {
  return fmt::format("{}{}N={} K={} E={} top-{} {} {} {}", p.label, p.label.empty() ? "" : " ", p.n, p.k,
                     p.num_experts, p.top_k, weight_format_name(p.weight),
                     p.act == ActFormat::BF16 ? "w4a16" : "w4a4", epi_name(p.epilogue));
}

GemmProblem problem_of(const cuda::MoeGemmDesc& d, int top_k) {
  GemmProblem p;
  p.num_experts = d.num_experts;
  p.n = d.n;
  p.k = d.k;
  p.top_k = top_k;
  p.weight = d.weight;
  p.act = d.act;
  p.epilogue = d.epilogue;
  return p;
}

cuda::MoeGemmDesc desc_of(const GemmProblem& p, int max_tokens) {
  cuda::MoeGemmDesc d;
  d.num_experts = p.num_experts;
  d.n = p.n;
  d.k = p.k;
  d.max_tokens = max_tokens;
  d.weight = p.weight;
  d.act = p.act;
  d.epilogue = p.epilogue;
  return d;
}

namespace {
constexpr GemmKernel kAllKernels[] = {GemmKernel::Sm90Wgmma,     GemmKernel::Sm90Decode,
                                      GemmKernel::DequantCublas, GemmKernel::Generic,
                                      GemmKernel::Sm100Tcgen05BlockScaled, GemmKernel::Sm120MmaBlockScaled};
}

std::string_view impl_name(GemmKernel i) {
  switch (i) {
    case GemmKernel::Sm90Wgmma: return "sm90-wgmma";
    case GemmKernel::Sm90Decode: return "sm90-decode";
    case GemmKernel::DequantCublas: return "dequant-cublas";
    case GemmKernel::Generic: return "generic";
    case GemmKernel::Sm100Tcgen05BlockScaled: return "sm100-tcgen05-bs";
    case GemmKernel::Sm120MmaBlockScaled: return "sm120-mma-bs";
  }
  return "?";
}

std::optional<GemmKernel> impl_from_name(std::string_view s) {
  for (GemmKernel i : kAllKernels)
    if (s == impl_name(i)) return i;
  return std::nullopt;
}

bool impl_is_listed_only(GemmKernel i) {
  return i == GemmKernel::Sm100Tcgen05BlockScaled || i == GemmKernel::Sm120MmaBlockScaled;
}

std::string tactic_name(const Tactic& t) {
  if (t.kernel == GemmKernel::Generic || t.kernel == GemmKernel::DequantCublas || t.block_m == 0)
    return std::string(impl_name(t.kernel));
  std::string s = fmt::format("{} {}x{}x{} s{}", impl_name(t.kernel), t.block_m, t.block_n, t.block_k, t.stages);
  if (t.split_k > 1) s += fmt::format(" splitk{}", t.split_k);
  if (t.cluster > 1) s += fmt::format(" cluster{}", t.cluster);
  return s;
}

std::string_view reject_kind_name(RejectKind k) {
  switch (k) {
    case RejectKind::Arch: return "arch";
    case RejectKind::Numerics: return "numerics";
    case RejectKind::Shape: return "shape";
    case RejectKind::SharedMemory: return "shared memory";
    case RejectKind::Registers: return "registers";
  }
  return "?";
}

bool Feasibility::rejected_for(RejectKind k) const {
  for (const Reason& r : reasons)
    if (r.kind == k) return true;
  return false;
}

bool Feasibility::only_rejected_for(RejectKind k) const {
  if (ok) return false;
  for (const Reason& r : reasons)
    if (r.kind != k) return false;
  return true;
}

std::string Feasibility::reason() const {
  std::string s;
  for (const Reason& r : reasons) s += (s.empty() ? "" : "; ") + r.text;
  return s;
}

std::vector<KernelIdentity> kernel_identities(std::string_view op) {
  FP4MOE_CHECK(op == "moe-gemm", "unknown op '{}' (known: moe-gemm)", op);
  namespace id = kernel_ids;
  return {{GemmKernel::Sm90Wgmma, id::kSm90Wgmma, id::kSm90Layout},
          {GemmKernel::Sm90Decode, id::kSm90Decode, id::kSm90Layout},
          {GemmKernel::DequantCublas, id::kDequantCublas, "checkpoint-linear"},
          {GemmKernel::Generic, id::kGeneric, "checkpoint-linear"}};
}

std::string registry_key(const std::vector<KernelIdentity>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  auto mix = [&h](std::string_view s) {
    for (const char c : s) {
      h ^= uint8_t(c);
      h *= 0x100000001b3ull;
    }
    h ^= 0xff;  // field separator
    h *= 0x100000001b3ull;
  };
  for (const KernelIdentity& i : ids) {
    mix(impl_name(i.gemm));
    mix(i.kernel_id);
    mix(i.layout_id);
  }
  return fmt::format("{:016x}", h);
}

std::vector<std::string> known_ops() { return {"moe-gemm"}; }

std::vector<TacticDef> tactics_for(std::string_view op, const GemmProblem& p) {
  if (op == "moe-gemm") return moe_gemm_tactics(p);
  FP4MOE_FAIL("unknown op '{}' (known: moe-gemm)", op);
}

Tactic fallback_tactic(std::string_view op) {
  FP4MOE_CHECK(op == "moe-gemm", "unknown op '{}' (known: moe-gemm)", op);
  return Tactic{GemmKernel::Generic};
}

}  // namespace fp4moe::tuner
