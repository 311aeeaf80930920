#include "tuner/plan_cache.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/log.hpp"

namespace fp4moe::tuner {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "fp4moe-plans/1";

json key_to_json(const PlanKey& k) {
  return {{"gpu", k.gpu_name},
          {"sm_count", k.sm_count},
          {"driver", k.driver_version},
          {"runtime", k.runtime_version},
          {"fp4moe", k.fp4moe_version}};
}

PlanKey key_from_json(const json& j) {
  PlanKey k;
  k.gpu_name = j.at("gpu").get<std::string>();
  k.sm_count = j.at("sm_count").get<int>();
  k.driver_version = j.at("driver").get<int>();
  k.runtime_version = j.at("runtime").get<int>();
  k.fp4moe_version = j.at("fp4moe").get<std::string>();
  return k;
}

json tactic_to_json(const Tactic& t) {
  return {{"impl", std::string(impl_name(t.impl))}, {"block_m", t.cfg.block_m}, {"block_n", t.cfg.block_n},
          {"block_k", t.cfg.block_k},  {"stages", t.cfg.stages},   {"split_k", t.cfg.split_k},
          {"cluster", t.cfg.cluster},  {"name", t.name()}};
}

Tactic tactic_from_json(const json& j) {
  const std::string impl = j.at("impl").get<std::string>();
  auto i = impl_from_name(impl);
  FP4MOE_CHECK(i.has_value(), "unknown implementation '{}'", impl);
  Tactic t{*i, TileCfg{}};
  t.cfg.block_m = j.at("block_m").get<int>();
  t.cfg.block_n = j.at("block_n").get<int>();
  t.cfg.block_k = j.at("block_k").get<int>();
  t.cfg.stages = j.at("stages").get<int>();
  t.cfg.split_k = j.at("split_k").get<int>();
  t.cfg.cluster = j.at("cluster").get<int>();
  return t;
}

json entry_to_json(const PlanEntry& e) {
  json timings = json::array();
  for (const TacticTiming& t : e.timings)
    timings.push_back({{"tactic", t.tactic}, {"median_us", t.median_us}, {"tflops", t.tflops}, {"gbps", t.gbps}});
  return {{"op", e.op},
          {"n", e.n},
          {"k", e.k},
          {"experts", e.num_experts},
          {"weight", std::string(weight_format_name(e.weight))},
          {"act", std::string(act_name(e.act))},
          {"epilogue", std::string(epi_name(e.epilogue))},
          {"bucket", e.bucket},
          {"best", tactic_to_json(e.best)},
          {"best_us", e.best_us},
          {"timings", timings}};
}

PlanEntry entry_from_json(const json& j) {
  PlanEntry e;
  e.op = j.at("op").get<std::string>();
  e.n = j.at("n").get<int>();
  e.k = j.at("k").get<int>();
  e.num_experts = j.at("experts").get<int>();
  const std::string w = j.at("weight").get<std::string>(), a = j.at("act").get<std::string>(),
                    ep = j.at("epilogue").get<std::string>();
  auto wf = weight_from_name(w);
  auto af = act_from_name(a);
  auto ef = epi_from_name(ep);
  FP4MOE_CHECK(wf && af && ef, "bad weight/act/epilogue '{}'/'{}'/'{}'", w, a, ep);
  e.weight = *wf;
  e.act = *af;
  e.epilogue = *ef;
  e.bucket = j.at("bucket").get<int64_t>();
  FP4MOE_CHECK(e.bucket >= 1, "bad bucket {}", e.bucket);
  e.best = tactic_from_json(j.at("best"));
  e.best_us = j.at("best_us").get<double>();
  for (const json& t : j.at("timings"))
    e.timings.push_back({t.at("tactic").get<std::string>(), t.at("median_us").get<double>(),
                         t.value("tflops", 0.0), t.value("gbps", 0.0)});
  return e;
}

}  // namespace

std::string to_string(const PlanKey& k) {
  return fmt::format("{} ({} SMs, driver {}, CUDA runtime {}, fp4moe {})", k.gpu_name.empty() ? "no GPU" : k.gpu_name,
                     k.sm_count, k.driver_version, k.runtime_version, k.fp4moe_version);
}

PlanKey current_plan_key(int device) {
  PlanKey k;
  if (!have_device()) return k;
  const ArchInfo a = device_arch(device);
  k.gpu_name = a.gpu_name;
  k.sm_count = a.sm_count;
  k.driver_version = a.driver_version;
  k.runtime_version = a.runtime_version;
  return k;
}

int64_t tokens_bucket(int64_t tokens) {
  int64_t b = 1;
  while (b < tokens) b *= 2;
  return b;
}

bool PlanEntry::same_problem(const std::string& op_, const GemmProblem& p) const {
  return op == op_ && n == p.n && k == p.k && num_experts == p.num_experts && weight == p.weight && act == p.act &&
         epilogue == p.epilogue;
}

std::string PlanCache::default_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "fp4moe" / "plans.json").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "fp4moe" / "plans.json").string();
  return (fs::path(".cache") / "fp4moe" / "plans.json").string();
}

bool PlanCache::load() {
  entries_.clear();
  std::error_code ec;
  if (!fs::exists(path_, ec)) return false;
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    log_warn("plan cache {}: cannot be read; ignoring it (it will be rebuilt)", path_);
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<PlanEntry> loaded;
  try {
    const json j = json::parse(ss.str());
    FP4MOE_CHECK(j.is_object() && j.value("format", "") == kFormat, "not an {} file", kFormat);
    const PlanKey file_key = key_from_json(j.at("key"));
    if (!(file_key == key_)) {
      log_warn("plan cache {} is stale: it was tuned on {}, this is {}; ignoring it (it will be rebuilt)", path_,
               to_string(file_key), to_string(key_));
      return false;
    }
    for (const json& e : j.at("entries")) loaded.push_back(entry_from_json(e));
  } catch (const std::exception& e) {
    log_warn("plan cache {} is corrupt ({}); ignoring it (it will be rebuilt)", path_, e.what());
    return false;
  }
  entries_ = std::move(loaded);
  return !entries_.empty();
}

void PlanCache::save() const {
  FP4MOE_CHECK(!path_.empty(), "plan cache has no path");
  json entries = json::array();
  for (const PlanEntry& e : entries_) entries.push_back(entry_to_json(e));
  const json j = {{"format", kFormat}, {"key", key_to_json(key_)}, {"entries", entries}};
  const fs::path target(path_);
  std::error_code ec;
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    FP4MOE_CHECK(!ec, "cannot create {}: {}", target.parent_path().string(), ec.message());
  }
  const fs::path tmp = target.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FP4MOE_CHECK(out.good(), "cannot write {}", tmp.string());
    out << j.dump(1) << '\n';
    out.flush();
    FP4MOE_CHECK(out.good(), "error writing {}", tmp.string());
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp);
    FP4MOE_FAIL("cannot rename {} to {}: {}", tmp.string(), target.string(), ec.message());
  }
}

void PlanCache::put(PlanEntry e) {
  for (PlanEntry& old : entries_)
    if (old.op == e.op && old.n == e.n && old.k == e.k && old.num_experts == e.num_experts && old.weight == e.weight &&
        old.act == e.act && old.epilogue == e.epilogue && old.bucket == e.bucket) {
      old = std::move(e);
      return;
    }
  entries_.push_back(std::move(e));
}

const PlanEntry* PlanCache::find(const std::string& op, const GemmProblem& p, int64_t bucket) const {
  for (const PlanEntry& e : entries_)
    if (e.same_problem(op, p) && e.bucket == bucket) return &e;
  return nullptr;
}

const PlanEntry* PlanCache::nearest(const std::string& op, const GemmProblem& p, int64_t tokens) const {
  const double want = std::log2(double(std::max<int64_t>(tokens, 1)));
  const PlanEntry* best = nullptr;
  double best_d = 0;
  for (const PlanEntry& e : entries_) {
    if (!e.same_problem(op, p)) continue;
    const double d = std::fabs(std::log2(double(e.bucket)) - want);
    if (!best || d < best_d - 1e-9 || (std::fabs(d - best_d) <= 1e-9 && e.bucket > best->bucket)) {
      best = &e;
      best_d = d;
    }
  }
  return best;
}

Tactic plan_for(const PlanCache& cache, const GemmProblem& p, int64_t tokens, const ArchInfo& arch,
                const std::string& op) {
  const PlanEntry* e = cache.nearest(op, p, tokens);
  if (!e) return fallback_tactic(op);
  for (const TacticDef& d : tactics_for(op, p))
    if (d.tactic == e->best) {
      const Feasibility f = d.valid(p, arch);
      if (f.ok && !impl_is_listed_only(d.tactic.impl)) return d.tactic;
      log_warn("plan cache: {} is not valid for {} on {} ({}); using {}", d.tactic.name(), to_string(p), arch.name,
               f.reason(), fallback_tactic(op).name());
      return fallback_tactic(op);
    }
  log_warn("plan cache: tactic {} is unknown to this build; using {}", e->best.name(), fallback_tactic(op).name());
  return fallback_tactic(op);
}

namespace {
struct ProcessPlans {
  std::mutex mu;
  bool loaded = false;
  PlanCache cache;
  std::optional<ArchInfo> arch;
};
ProcessPlans& process_plans() {
  static ProcessPlans p;
  return p;
}
}  // namespace

Tactic plan_for(const GemmProblem& p, int64_t tokens, const std::string& op) {
  ProcessPlans& pp = process_plans();
  std::lock_guard<std::mutex> lock(pp.mu);
  if (!pp.loaded) {
    pp.loaded = true;
    if (have_device()) {
      const char* env = std::getenv("FP4MOE_PLAN_CACHE");
      pp.cache = PlanCache(env && *env ? std::string(env) : PlanCache::default_path(), current_plan_key());
      pp.cache.load();
      pp.arch = device_arch();
    }
  }
  if (!pp.arch) return fallback_tactic(op);
  return plan_for(pp.cache, p, tokens, *pp.arch, op);
}

void reset_plan_for_cache() {
  ProcessPlans& pp = process_plans();
  std::lock_guard<std::mutex> lock(pp.mu);
  pp.loaded = false;
  pp.cache = PlanCache();
  pp.arch.reset();
}

}  // namespace fp4moe::tuner
