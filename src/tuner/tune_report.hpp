// What `fp4moe tune` computes and prints: the problems of a model, the feasibility of every
// tactic on an architecture (dry run: no GPU needed), the measured ranking per tokens bucket,
// and a one-line verdict per op in plain words.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tuner/arch.hpp"
#include "tuner/tactic.hpp"

namespace fp4moe::tuner {

// GLM-5's two MoE GEMMs ("glm5": gate_up N=4096 K=6144 SiluMul, down N=6144 K=2048 RowScale,
// E=256, top-8) or a tiny stand-in ("tiny": N=256 K=512 / N=512 K=128, E=8, top-2).
std::vector<GemmProblem> preset_problems(const std::string& preset, ActFormat act = ActFormat::BF16);
// The same two GEMMs from a checkpoint's config (hidden, moe_intermediate_size, experts,
// top-k, NVFP4/MXFP4 from its quantization config).
std::vector<GemmProblem> model_problems(const std::string& dir, ActFormat act = ActFormat::BF16);

struct TacticVerdict {
  Tactic tactic;
  Feasibility feasibility;
};
struct ProblemFeasibility {
  GemmProblem problem;
  std::vector<TacticVerdict> feasible, rejected;
};
ProblemFeasibility check_feasibility(const std::string& op, const GemmProblem& p, const ArchInfo& arch);

std::string describe_arch(const ArchInfo& a);  // one paragraph: limits and instruction families

// The dry-run report: per problem the feasible tactics and the rejected ones with reasons;
// the shared memory of the interesting ones term by term (of all with explain); a verdict.
std::string format_feasibility(const std::string& op, const std::vector<ProblemFeasibility>& all,
                               const ArchInfo& arch, bool explain);
std::string feasibility_verdict(const std::string& op, const std::vector<ProblemFeasibility>& all,
                                const ArchInfo& arch);
nlohmann::json feasibility_json(const std::vector<ProblemFeasibility>& all);

// ---- measured ----

struct Measurement {
  Tactic tactic;
  enum class Status : uint8_t { Ok, LaunchFailed, Disqualified, Skipped } status = Status::Ok;
  double median_us = 0, min_us = 0;
  int runs = 0;
  double tflops = 0, gbps = 0;
  double rel_err = -1;      // worst checked row vs the CPU reference, -1 when not checked
  std::string error;        // launch error / why disqualified / skipped
};

struct BucketResult {
  int64_t tokens = 0, bucket = 0;
  int64_t m_total = 0;      // rows = tokens * top_k
  int experts_hit = 0;
  double flops = 0, bytes = 0;  // of the problem at this bucket (for TFLOP/s and GB/s)
  std::vector<Measurement> ranked;    // Ok ones, fastest first
  std::vector<Measurement> dropped;   // failed / disqualified / skipped
  const Measurement* best() const { return ranked.empty() ? nullptr : &ranked.front(); }
  const Measurement* of(GemmKernel i) const;  // fastest Ok measurement of that implementation
};

struct ProblemResult {
  GemmProblem problem;
  std::vector<BucketResult> buckets;
};

std::string format_measured(const std::vector<ProblemResult>& results);
// "sm90-wgmma is fastest at every bucket; dequant-cublas is 1.8-3.1x slower and has no grouped
//  path: the current path is the best one."
std::string measured_verdict(const std::string& op, const std::vector<ProblemResult>& results);
nlohmann::json measured_json(const std::vector<ProblemResult>& results);

}  // namespace fp4moe::tuner
