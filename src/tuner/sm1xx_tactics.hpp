// The Blackwell tactics of op "moe-gemm": the block-scaled NVFP4 grouped GEMMs of
// cuda/moe_gemm_sm1xx (CUTLASS; sm_100a / sm_120a; compiled, not run). Their shared memory is
// not modelled here: each tactic carries what its CUTLASS types say (sizeof(SharedStorage),
// the stage count the builder resolved), computed by the facts translation units of the archs
// this binary was built for, and judged against the architecture model (arch.hpp).
#pragma once

#include <vector>

#include "tuner/tactic.hpp"

namespace fp4moe::tuner {

// Appends one tactic per listed config whose CUTLASS types this build compiled (none in a build
// without CUDA or without sm_100a / sm_120a; the dry run then says so).
void append_sm1xx_tactics(const GemmProblem& p, std::vector<TacticDef>& out);

// True when this binary carries the CUTLASS type facts of at least one Blackwell arch.
bool sm1xx_facts_available();

// One line on why there are no Blackwell tactics in this binary ("" when there are).
std::string sm1xx_absence_reason();

}  // namespace fp4moe::tuner
