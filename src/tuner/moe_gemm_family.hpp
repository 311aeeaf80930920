// Which MoE GEMM kernel family runs on a device: the arch -> family table, in one place.
//
//   compute capability 9.0        -> Sm90:    the sm_90a kernels (wgmma; mma.sync decode), W4A16
//   compute capability 10.0, 12.0 -> Sm1xx:   cuda/moe_gemm_sm1xx's CUTLASS block-scaled NVFP4
//                                             grouped GEMMs, W4A4 (compiled, not run)
//   any other the binary can run  -> Generic: the mma.sync fallback (any shape), W4A16
//   a device the binary has no code for -> None, with one line saying what to rebuild with.
//
// A family's kernels exist only when their arch is in this binary's CMAKE_CUDA_ARCHITECTURES
// ("90a" for Sm90, "100a" / "120a" for Sm1xx: arch-specific cubins run on exactly that compute
// capability); without them the device gets the Generic fallback when the binary's other code
// runs on it, else None. The family's configs are the tactics of the tuner's registry that are
// feasible on the arch (shared memory from each kernel's own arithmetic: sm90_tile_layout.hpp,
// the CUTLASS types' sizeof(SharedStorage)). Plain C++: the tests feed made-up devices.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tuner/arch.hpp"
#include "tuner/tactic.hpp"

namespace fp4moe::tuner {

enum class MoeGemmFamily : uint8_t { Sm90, Sm1xx, Generic, None };
std::string_view family_name(MoeGemmFamily f);  // "sm90" | "sm1xx" | "generic" | "none"

// One entry of CMAKE_CUDA_ARCHITECTURES: "90a" (SASS + PTX for compute_90a), "89-real" (SASS
// only), "89-virtual" (PTX only), "89" (both).
struct CompiledArch {
  int cc = 0;
  bool arch_specific = false;    // "a": runs on exactly this compute capability
  bool family_specific = false;  // "f": runs on this one and the later minors of its major
  bool sass = true, ptx = true;
  bool runs_on(int device_cc) const;  // this entry's code loads on a device of that compute capability
};
// Parses a CMake architecture list ("90a;100a;120a"); throws fp4moe::Error on a malformed entry.
std::vector<CompiledArch> parse_cuda_archs(std::string_view list);
// This binary's list (empty without CUDA) and its text ("90a;100a;120a", "" without CUDA).
std::span<const CompiledArch> compiled_cuda_archs();
std::string_view compiled_cuda_archs_text();

// The device's architecture model from its reported properties (what device_arch() reads; the
// tests pass made-up ones): the table row of its compute capability, every reported limit
// overwritten by the device's value.
struct DeviceProps {
  int cc = 0;
  std::string name;
  int64_t smem_per_block_optin = 0, smem_per_sm = 0, smem_reserved_per_block = 0;
  int regs_per_sm = 0, regs_per_block = 0;
  int max_threads_per_block = 0, max_threads_per_sm = 0, max_blocks_per_sm = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};
ArchInfo arch_of_device(const DeviceProps& p);

struct FamilyConfig {
  Tactic tactic;
  int64_t smem_bytes = 0;  // the tactic's shared memory (its feasibility's plan), 0 when it has none
};

struct FamilyChoice {
  MoeGemmFamily family = MoeGemmFamily::None;
  ActFormat act = ActFormat::BF16;    // the family's numerics: Sm1xx computes W4A4
  std::vector<FamilyConfig> configs;  // the family's tactics feasible for the problem on the arch
  std::string why;                    // one line: why this family; for None, what to rebuild with
};

// The family for `p` (its act is ignored: each family has its own numerics; w4a4 asks for W4A4
// where the family can emulate it, i.e. Sm90) on `arch`, with the binary's `compiled` archs. A
// family whose kernels cannot take the problem (format, shape, no config fits) gives way to
// Generic, and `why` says so.
FamilyChoice select_moe_gemm_family(const ArchInfo& arch, const GemmProblem& p, std::span<const CompiledArch> compiled,
                                    bool w4a4 = false);

}  // namespace fp4moe::tuner
