// The profiler: measures every feasible, implemented tactic of an op on this GPU per tokens
// bucket. Random routing (top-k distinct experts per token, fixed seed), random FP4 weights;
// warm-up, then the median of >= min_runs timed runs (CUDA events), activations rotated over
// enough copies to exceed twice the L2 and a 2x-L2 write before every timed run (cold L2); a
// tactic that throws or fails at launch is dropped with its error; one whose output differs
// from the CPU reference (cpu/grouped_gemm_ref.hpp: no kernel under test is the reference) on
// any checked row by more than `tolerance` (the row's ||y-ref|| / ||ref||) is disqualified.
// CUDA builds only: elsewhere profile_problem throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tuner/arch.hpp"
#include "tuner/tactic.hpp"
#include "tuner/tune_report.hpp"

namespace fp4moe::tuner {

struct ProfileOptions {
  std::vector<int64_t> tokens = {1, 8, 32, 128, 512, 2048, 8192, 16384};
  int warmup = 3;
  int min_runs = 20;
  double max_seconds_per_tactic = 1.5;  // stop adding runs past this (after min_runs)
  double tolerance = 1e-2;
  int check_rows = 64;                  // rows compared against the CPU reference (cpu sample_rows:
                                        // tile edges of spread experts + evenly spread rows)
  uint64_t seed = 20261202;
};

bool profiler_available();  // built with CUDA and a device is present

ProblemResult profile_problem(const std::string& op, const GemmProblem& p, const ArchInfo& arch,
                              const ProfileOptions& opt);

}  // namespace fp4moe::tuner
