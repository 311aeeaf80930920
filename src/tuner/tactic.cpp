#include "tuner/tactic.hpp"

#include <ostream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "tuner/kernel_ids.hpp"

namespace fp4moe::tuner {

std::string_view act_name(Act a) { return a == Act::BF16 ? "bf16" : "nvfp4"; }

std::string_view epi_name(Epi e) {
  switch (e) {
    case Epi::None: return "none";
    case Epi::SiluMul: return "silu_mul";
    case Epi::RowScale: return "row_scale";
  }
  return "?";
}

std::optional<Act> act_from_name(std::string_view s) {
  if (s == "bf16" || s == "w4a16") return Act::BF16;
  if (s == "nvfp4" || s == "w4a4") return Act::NVFP4;
  return std::nullopt;
}

std::optional<Epi> epi_from_name(std::string_view s) {
  for (Epi e : {Epi::None, Epi::SiluMul, Epi::RowScale})
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
                     p.act == Act::BF16 ? "w4a16" : "w4a4", epi_name(p.epilogue));
}

namespace {
constexpr Impl kAllImpls[] = {Impl::Sm90Wgmma,     Impl::Sm90Decode,
                              Impl::DequantCublas, Impl::Generic,
                              Impl::Sm100Tcgen05BlockScaled, Impl::Sm120MmaBlockScaled};
}

std::string_view impl_name(Impl i) {
  switch (i) {
    case Impl::Sm90Wgmma: return "sm90-wgmma";
    case Impl::Sm90Decode: return "sm90-decode";
    case Impl::DequantCublas: return "dequant-cublas";
    case Impl::Generic: return "generic";
    case Impl::Sm100Tcgen05BlockScaled: return "sm100-tcgen05-bs";
    case Impl::Sm120MmaBlockScaled: return "sm120-mma-bs";
  }
  return "?";
}

std::optional<Impl> impl_from_name(std::string_view s) {
  for (Impl i : kAllImpls)
    if (s == impl_name(i)) return i;
  return std::nullopt;
}

bool impl_is_listed_only(Impl i) {
  return i == Impl::Sm100Tcgen05BlockScaled || i == Impl::Sm120MmaBlockScaled;
}

std::string Tactic::name() const {
  if (impl == Impl::Generic || impl == Impl::DequantCublas || cfg.block_m == 0)
    return std::string(impl_name(impl));
  std::string s = fmt::format("{} {}x{}x{} s{}", impl_name(impl), cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages);
  if (cfg.split_k > 1) s += fmt::format(" splitk{}", cfg.split_k);
  if (cfg.cluster > 1) s += fmt::format(" cluster{}", cfg.cluster);
  return s;
}

std::ostream& operator<<(std::ostream& os, const Tactic& t) { return os << t.name(); }

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
  return {{Impl::Sm90Wgmma, id::kSm90Wgmma, id::kSm90Layout},
          {Impl::Sm90Decode, id::kSm90Decode, id::kSm90Layout},
          {Impl::DequantCublas, id::kDequantCublas, "checkpoint-linear"},
          {Impl::Generic, id::kGeneric, "checkpoint-linear"}};
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
    mix(impl_name(i.impl));
    mix(i.kernel);
    mix(i.layout);
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
  return Tactic{Impl::Generic, TileCfg{}};
}

}  // namespace fp4moe::tuner
