// fp4moe tune: validate the kernel path on this GPU (or, --dry-run, on any architecture of the
// table): rule out what cannot run with the arithmetic, measure what can per tokens bucket,
// keep the winner in the plan cache, and state the verdict.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "tuner/arch.hpp"
#include "tuner/plan_cache.hpp"
#include "tuner/profiler.hpp"
#include "tuner/tune_report.hpp"

namespace {

using namespace fp4moe;
using namespace fp4moe::tuner;

struct TuneArgs {
  std::string op = "moe-gemm";
  std::string model, preset, arch, json_path, plan_cache, tokens, act = "w4a16";
  bool dry_run = false, explain = false;
  int min_runs = 20;
};

std::vector<int64_t> parse_tokens(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    FP4MOE_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos,
                 "--tokens: '{}' is not a positive integer", item);
    const int64_t v = std::stoll(item);
    FP4MOE_CHECK(v >= 1 && v <= (int64_t(1) << 20), "--tokens: {} is out of range [1, 1048576]", v);
    out.push_back(v);
  }
  FP4MOE_CHECK(!out.empty(), "--tokens: empty list");
  return out;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::trunc);
  FP4MOE_CHECK(out.good(), "cannot write {}", path);
  out << j.dump(1) << '\n';
  FP4MOE_CHECK(out.good(), "error writing {}", path);
}

int run_tune(const TuneArgs& a) {
  bool op_known = false;
  for (const std::string& o : known_ops()) op_known |= o == a.op;
  FP4MOE_CHECK(op_known, "--op: unknown op '{}' (known: moe-gemm)", a.op);
  const auto act = act_from_name(a.act);
  FP4MOE_CHECK(act.has_value(), "--act: '{}' is not w4a16 or w4a4", a.act);
  FP4MOE_CHECK(a.model.empty() || a.preset.empty(), "--model and --preset exclude each other");
  const std::vector<GemmProblem> problems =
      a.model.empty() ? preset_problems(a.preset.empty() ? "glm5" : a.preset, *act) : model_problems(a.model, *act);

  ArchInfo arch;
  if (!a.arch.empty()) {
    arch = arch_by_name(a.arch);
    if (!a.dry_run) {
      FP4MOE_CHECK(have_device(), "--arch {} without --dry-run needs a GPU of that architecture; none is present "
                                  "(add --dry-run for feasibility only)", a.arch);
      const ArchInfo dev = device_arch();
      FP4MOE_CHECK(dev.cc == arch.cc, "--arch {}: this GPU is {} ({}); add --dry-run to judge {} without running it",
                   a.arch, dev.name, dev.gpu_name, arch.name);
      arch = dev;
    }
  } else if (have_device()) {
    arch = device_arch();
  } else {
    FP4MOE_CHECK(a.dry_run, "no GPU is present: pass --arch sm_XX --dry-run for feasibility only");
    FP4MOE_FAIL("--dry-run without a GPU needs --arch (one of sm_80, 86, 89, 90, 100, 103, 120, 121)");
  }

  std::printf("fp4moe tune --op %s on %s", a.op.c_str(), describe_arch(arch).c_str());
  std::vector<ProblemFeasibility> feas;
  for (const GemmProblem& p : problems) feas.push_back(check_feasibility(a.op, p, arch));
  std::printf("%s", format_feasibility(a.op, feas, arch, a.explain).c_str());

  nlohmann::json out = {{"op", a.op},
                        {"arch", {{"name", arch.name},
                                  {"source", arch.source},
                                  {"gpu", arch.gpu_name},
                                  {"smem_per_block_optin", arch.smem_per_block_optin},
                                  {"smem_per_sm", arch.smem_per_sm},
                                  {"sm_count", arch.sm_count}}},
                        {"dry_run", a.dry_run},
                        {"feasibility", feasibility_json(feas)},
                        {"feasibility_verdict", feasibility_verdict(a.op, feas, arch)}};
  if (a.dry_run) {
    if (!a.json_path.empty()) write_json(a.json_path, out);
    return 0;
  }

  FP4MOE_CHECK(profiler_available(), "this fp4moe was built without CUDA: only --dry-run is available");
  ProfileOptions opt;
  if (!a.tokens.empty()) opt.tokens = parse_tokens(a.tokens);
  FP4MOE_CHECK(a.min_runs >= 20, "--runs: at least 20 timed runs (got {})", a.min_runs);
  opt.min_runs = a.min_runs;
  std::vector<ProblemResult> results;
  for (const GemmProblem& p : problems) results.push_back(profile_problem(a.op, p, arch, opt));
  std::printf("%s", format_measured(results).c_str());
  const std::string verdict = measured_verdict(a.op, results);
  std::printf("\nverdict: %s\n", verdict.c_str());

  PlanCache cache(a.plan_cache.empty() ? PlanCache::configured_path() : a.plan_cache, current_plan_key());
  cache.load();
  int stored = 0;
  for (const ProblemResult& pr : results)
    for (const BucketResult& b : pr.buckets) {
      const Measurement* best = b.best();
      if (!best) continue;
      PlanEntry e;
      e.op = a.op;
      e.n = pr.problem.n;
      e.k = pr.problem.k;
      e.num_experts = pr.problem.num_experts;
      e.weight = pr.problem.weight;
      e.act = pr.problem.act;
      e.epilogue = pr.problem.epilogue;
      e.bucket = b.bucket;
      e.best = best->tactic;
      e.best_us = best->median_us;
      for (const Measurement& m : b.ranked) e.timings.push_back({tactic_name(m.tactic), m.median_us, m.tflops, m.gbps});
      cache.put(std::move(e));
      ++stored;
    }
  cache.save();
  reset_plan_for_cache();
  std::printf("plan cache: %d entries written to %s (%zu in the file; key: %s)\n", stored, cache.path().c_str(),
              cache.entries().size(), to_string(cache.key()).c_str());
  out["measured"] = measured_json(results);
  out["verdict"] = verdict;
  out["plan_cache"] = cache.path();
  if (!a.json_path.empty()) write_json(a.json_path, out);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<TuneArgs>();
  app.add_option("--op", a->op, "Op to tune (moe-gemm)");
  app.add_option("--model", a->model, "Checkpoint folder: the GEMM shapes come from its config");
  app.add_option("--preset", a->preset, "Shapes of a known model: glm5 (default), tiny");
  app.add_option("--arch", a->arch, "Architecture (sm_80 ... sm_121); without a GPU only with --dry-run");
  app.add_flag("--dry-run", a->dry_run, "Feasibility only: launch nothing, no GPU needed");
  app.add_flag("--explain", a->explain, "Print the shared memory of every tactic term by term");
  app.add_option("--act", a->act, "Activations: w4a16 (BF16, default) or w4a4 (NVFP4, Blackwell numerics)");
  app.add_option("--json", a->json_path, "Write the whole report as JSON");
  app.add_option("--plan-cache", a->plan_cache,
                 "Plan cache file (default: $FP4MOE_PLAN_CACHE, else $XDG_CACHE_HOME/fp4moe/plans.json: where the "
                 "MoE layer reads it)");
  app.add_option("--tokens", a->tokens, "Token counts to measure, e.g. 1,8,128 (default 1,8,32,128,512,2048,8192,16384)");
  app.add_option("--runs", a->min_runs, "Timed runs per tactic (>= 20; median reported)");
  run = [a] { return run_tune(*a); };
}

fp4moe::cli::Registrar reg{"tune", "Validate the kernel path: feasibility, measurement, plan cache, verdict", setup};

}  // namespace
