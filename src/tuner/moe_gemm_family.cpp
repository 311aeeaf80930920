// The arch -> MoE GEMM kernel family table (moe_gemm_family.hpp).
#include "tuner/moe_gemm_family.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>

#include "core/error.hpp"

#ifndef FP4MOE_CUDA_ARCHS
#define FP4MOE_CUDA_ARCHS ""  // a build without CUDA (src/tuner/CMakeLists.txt sets it from CMAKE_CUDA_ARCHITECTURES)
#endif

namespace fp4moe::tuner {
namespace {

// The table. A family runs on exactly one compute capability: its kernels are arch-specific
// ("a") cubins of that arch.
struct FamilyRow {
  int cc;
  MoeGemmFamily family;
  std::array<GemmKernel, 2> kernels;  // the tactics of the tuner's registry that belong to it
  int n_kernels;
  ActFormat act;                      // its numerics (Sm90: W4A16, or W4A4 emulation on request)
  const char* what;
};

constexpr std::array<FamilyRow, 3> kTable = {{
    {90, MoeGemmFamily::Sm90, {GemmKernel::Sm90Wgmma, GemmKernel::Sm90Decode}, 2, ActFormat::BF16,
     "the sm_90a kernels (wgmma; mma.sync decode)"},
    {100, MoeGemmFamily::Sm1xx, {GemmKernel::Sm100Tcgen05BlockScaled, GemmKernel::Sm100MoeDecodeBlockScaled}, 2,
     ActFormat::NVFP4_EMULATED, "the sm_100a CUTLASS block-scaled NVFP4 grouped GEMMs (tcgen05; W4A4; compiled, not run)"},
    {120, MoeGemmFamily::Sm1xx, {GemmKernel::Sm120MmaBlockScaled, GemmKernel::Sm120MmaBlockScaled}, 1,
     ActFormat::NVFP4_EMULATED,
     "the sm_120a CUTLASS block-scaled NVFP4 grouped GEMMs (mma.sync block_scale; W4A4; compiled, not run)"},
}};

std::string cc_words(int cc) { return fmt::format("sm_{} (compute capability {}.{})", cc, cc / 10, cc % 10); }

}  // namespace

std::string_view family_name(MoeGemmFamily f) {
  switch (f) {
    case MoeGemmFamily::Sm90: return "sm90";
    case MoeGemmFamily::Sm1xx: return "sm1xx";
    case MoeGemmFamily::Generic: return "generic";
    case MoeGemmFamily::None: return "none";
  }
  return "?";
}

bool CompiledArch::runs_on(int device_cc) const {
  if (arch_specific) return device_cc == cc;  // sm_XXa SASS and compute_XXa PTX: that arch only
  if (family_specific) return device_cc / 10 == cc / 10 && device_cc >= cc;  // sm_XXf: later minors of the major
  if (sass && device_cc / 10 == cc / 10 && device_cc >= cc) return true;  // SASS: same major, minor >=
  return ptx && device_cc >= cc;  // PTX: JIT-compiled by the driver for any later arch
}

std::vector<CompiledArch> parse_cuda_archs(std::string_view list) {
  std::vector<CompiledArch> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find_first_of(";,", pos), list.size());
    std::string item(list.substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) {
      if (end == list.size()) break;
      continue;
    }
    CompiledArch a;
    for (std::string_view suffix : {"-real", "-virtual"})
      if (item.size() > suffix.size() && item.compare(item.size() - suffix.size(), suffix.size(), suffix) == 0) {
        a.sass = suffix == "-real";
        a.ptx = !a.sass;
        item.resize(item.size() - suffix.size());
      }
    if (!item.empty() && (item.back() == 'a' || item.back() == 'f')) {
      a.arch_specific = item.back() == 'a';
      a.family_specific = item.back() == 'f';
      item.pop_back();
    }
    FP4MOE_CHECK(!item.empty() && item.size() <= 4 && std::all_of(item.begin(), item.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    }), "CUDA architecture list '{}': '{}' is not an architecture (e.g. 90a, 89-real)", list, item);
    a.cc = std::stoi(item);
    out.push_back(a);
    if (end == list.size()) break;
  }
  return out;
}

std::span<const CompiledArch> compiled_cuda_archs() {
  static const std::vector<CompiledArch> archs = parse_cuda_archs(FP4MOE_CUDA_ARCHS);
  return archs;
}

std::string_view compiled_cuda_archs_text() {
  static const std::string text = [] {
    std::string s = FP4MOE_CUDA_ARCHS;
    std::replace(s.begin(), s.end(), ',', ';');
    return s;
  }();
  return text;
}

ArchInfo arch_of_device(const DeviceProps& p) {
  const int cc = p.cc;
  ArchInfo a;
  bool found = false;
  for (const ArchInfo& t : arch_table())
    if (t.cc == cc) {
      a = t;
      found = true;
    }
  if (!found) {  // an architecture the table does not know: take the device's numbers only
    a.name = "sm_" + std::to_string(cc);
    a.cc = cc;
    a.cp_async = a.mma_sync_bf16 = cc >= 80;
    a.fp8_mma = cc >= 89;
    a.tma = a.clusters = cc >= 90;
  }
  a.source = "device";
  a.gpu_name = p.name;
  a.smem_per_block_optin = p.smem_per_block_optin;
  a.smem_per_sm = p.smem_per_sm;
  a.smem_reserved_per_block = p.smem_reserved_per_block;
  a.regs_per_sm = p.regs_per_sm;
  a.regs_per_block_max = p.regs_per_block;
  a.max_threads_per_block = p.max_threads_per_block;
  a.max_threads_per_sm = p.max_threads_per_sm;
  a.max_blocks_per_sm = p.max_blocks_per_sm;
  a.sm_count = p.sm_count;
  a.l2_bytes = p.l2_bytes;
  a.driver_version = p.driver_version;
  a.runtime_version = p.runtime_version;
  return a;
}

FamilyChoice select_moe_gemm_family(const ArchInfo& arch, const GemmProblem& p, std::span<const CompiledArch> compiled,
                                    bool w4a4) {
  FamilyChoice out;
  std::string built;
  for (const CompiledArch& c : compiled)
    built += fmt::format("{}{}{}", built.empty() ? "" : ";", c.cc, c.arch_specific ? "a" : "");
  if (built.empty()) built = "no CUDA architecture";
  const bool binary_runs =
      std::any_of(compiled.begin(), compiled.end(), [&](const CompiledArch& c) { return c.runs_on(arch.cc); });

  std::string not_used;  // why the arch's own family does not run it ("" when the arch has none)
  const auto row = std::find_if(kTable.begin(), kTable.end(), [&](const FamilyRow& r) { return r.cc == arch.cc; });
  if (row != kTable.end()) {
    const bool has_kernels = std::any_of(compiled.begin(), compiled.end(), [&](const CompiledArch& c) {
      return c.arch_specific && c.cc == row->cc;
    });
    if (!has_kernels) {
      not_used = fmt::format("{} are not in this binary (built for {}; they need {}a)", row->what, built, row->cc);
    } else {
      GemmProblem q = p;
      q.act = row->family == MoeGemmFamily::Sm90 && w4a4 ? ActFormat::NVFP4_EMULATED : row->act;
      std::string first_reject;
      for (const TacticDef& d : tactics_for("moe-gemm", q)) {
        if (std::find(row->kernels.begin(), row->kernels.begin() + row->n_kernels, d.tactic.kernel) ==
            row->kernels.begin() + row->n_kernels)
          continue;
        const Feasibility f = d.valid(q, arch);
        if (f.ok)
          out.configs.push_back({d.tactic, f.smem ? f.smem->total() : 0});
        else if (first_reject.empty())
          first_reject = tactic_name(d.tactic) + ": " + f.reason();
      }
      if (!out.configs.empty()) {
        out.family = row->family;
        out.act = q.act;
        out.why = fmt::format("{}: {}, {} config(s) within its {} B of shared memory per block", cc_words(arch.cc),
                              row->what, out.configs.size(), with_commas(arch.smem_per_block_optin));
        return out;
      }
      not_used = fmt::format("no config of {} takes {} on {} ({})", row->what, to_string(q), arch.name,
                             first_reject.empty() ? "none listed" : first_reject);
    }
  }
  if (!binary_runs) {
    out.why = fmt::format("this fp4moe has no GPU code for {} (built for {}): rebuild with "
                          "-DCMAKE_CUDA_ARCHITECTURES={}{}",
                          cc_words(arch.cc), built, arch.cc, row != kTable.end() ? "a" : "");
    return out;
  }
  GemmProblem q = p;
  q.act = ActFormat::BF16;
  const Tactic fb = fallback_tactic("moe-gemm");
  for (const TacticDef& d : tactics_for("moe-gemm", q))
    if (d.tactic == fb) {
      const Feasibility f = d.valid(q, arch);
      if (!f.ok) {
        out.why = fmt::format("no MoE GEMM of this fp4moe runs {} on {}: {}", to_string(q), cc_words(arch.cc), f.reason());
        return out;
      }
      out.configs.push_back({fb, f.smem ? f.smem->total() : 0});
    }
  out.family = MoeGemmFamily::Generic;
  out.act = ActFormat::BF16;
  out.why = fmt::format("{}: the Generic mma.sync fallback (W4A16){}", cc_words(arch.cc),
                        not_used.empty() ? std::string(", no faster family for this arch") : "; " + not_used);
  return out;
}

}  // namespace fp4moe::tuner
