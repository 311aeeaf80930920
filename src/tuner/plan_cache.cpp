#include "tuner/plan_cache.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <mutex>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/log.hpp"

namespace fp4moe::tuner {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "fp4moe-plans/2";  // /2: the key carries the kernel identities

json key_to_json(const PlanKey& k) {
  return {{"gpu", k.gpu_name},
          {"sm_count", k.sm_count},
          {"driver", k.driver_version},
          {"runtime", k.runtime_version},
          {"kernels", k.kernels}};
}

PlanKey key_from_json(const json& j) {
  PlanKey k;
  k.gpu_name = j.at("gpu").get<std::string>();
  k.sm_count = j.at("sm_count").get<int>();
  k.driver_version = j.at("driver").get<int>();
  k.runtime_version = j.at("runtime").get<int>();
  k.kernels = j.at("kernels").get<std::string>();
  return k;
}

json tactic_to_json(const Tactic& t) {
  return {{"impl", std::string(impl_name(t.kernel))}, {"block_m", t.block_m}, {"block_n", t.block_n},
          {"block_k", t.block_k},  {"stages", t.stages},   {"split_k", t.split_k},
          {"cluster", t.cluster},  {"name", tactic_name(t)}};
}

Tactic tactic_from_json(const json& j) {
  const std::string impl = j.at("impl").get<std::string>();
  auto i = impl_from_name(impl);
  FP4MOE_CHECK(i.has_value(), "unknown implementation '{}'", impl);
  Tactic t{*i};
  t.block_m = j.at("block_m").get<int>();
  t.block_n = j.at("block_n").get<int>();
  t.block_k = j.at("block_k").get<int>();
  t.stages = j.at("stages").get<int>();
  t.split_k = j.at("split_k").get<int>();
  t.cluster = j.at("cluster").get<int>();
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
  return fmt::format("{} ({} SMs, driver {}, CUDA runtime {}, kernels {})", k.gpu_name.empty() ? "no GPU" : k.gpu_name,
                     k.sm_count, k.driver_version, k.runtime_version, k.kernels);
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

std::string PlanCache::configured_path() {
  if (const char* env = std::getenv("FP4MOE_PLAN_CACHE"); env && *env) return env;
  return default_path();
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
    FP4MOE_CHECK(j.is_object(), "not an {} file", kFormat);
    if (const std::string f = j.value("format", ""); f != kFormat) {
      FP4MOE_CHECK(f.rfind("fp4moe-plans/", 0) == 0, "not an {} file", kFormat);
      log_warn("plan cache {} has format {}, this fp4moe reads {}; ignoring it (it will be rebuilt)", path_, f, kFormat);
      return false;
    }
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

namespace {

// An exclusive flock on `path` (created if missing), released by the destructor.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    FP4MOE_CHECK(fd_ >= 0, "cannot open the lock file {}: {}", path, std::strerror(errno));
    int r;
    while ((r = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (r != 0) {
      const int e = errno;
      ::close(fd_);
      FP4MOE_FAIL("cannot lock {}: {}", path, std::strerror(e));
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes `text` to `path` and fsyncs it.
void write_durably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FP4MOE_CHECK(fd >= 0, "cannot write {}: {}", path, std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      FP4MOE_FAIL("error writing {}: {}", path, std::strerror(e));
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    FP4MOE_FAIL("cannot fsync {}: {}", path, std::strerror(e));
  }
  FP4MOE_CHECK(::close(fd) == 0, "error closing {}: {}", path, std::strerror(errno));
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // durability of the rename is best effort where the folder cannot be opened
  ::fsync(fd);
  ::close(fd);
}

bool same_slot(const PlanEntry& a, const PlanEntry& b) {
  return a.op == b.op && a.n == b.n && a.k == b.k && a.num_experts == b.num_experts && a.weight == b.weight &&
         a.act == b.act && a.epilogue == b.epilogue && a.bucket == b.bucket;
}

}  // namespace

void PlanCache::save() {
  FP4MOE_CHECK(!path_.empty(), "plan cache has no path");
  const fs::path target(path_);
  std::error_code ec;
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    FP4MOE_CHECK(!ec, "cannot create {}: {}", target.parent_path().string(), ec.message());
  }
  const FileLock lock(path_ + ".lock");
  {  // Merge: what another run saved since this cache was loaded stays (this cache's entries win).
    PlanCache on_disk(path_, key_);
    on_disk.load();
    for (PlanEntry& e : on_disk.entries_) {
      bool have = false;
      for (const PlanEntry& mine : entries_) have = have || same_slot(mine, e);
      if (!have) entries_.push_back(std::move(e));
    }
  }
  json entries = json::array();
  for (const PlanEntry& e : entries_) entries.push_back(entry_to_json(e));
  const json j = {{"format", kFormat}, {"key", key_to_json(key_)}, {"entries", entries}};
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = target.string() + fmt::format(".tmp.{}.{}", ::getpid(), counter++);
  try {
    write_durably(tmp.string(), j.dump(1) + "\n");
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp);
    FP4MOE_FAIL("cannot rename {} to {}: {}", tmp.string(), target.string(), ec.message());
  }
  fsync_dir(target.parent_path());
}

void PlanCache::put(PlanEntry e) {
  for (PlanEntry& old : entries_)
    if (same_slot(old, e)) {
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

namespace {
struct Warnings {
  std::mutex mu;
  std::set<std::string> said;
};
Warnings& warnings() {
  static Warnings w;
  return w;
}
// log_warn(msg) the first time this process sees msg.
void warn_once(const std::string& msg) {
  Warnings& w = warnings();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.said.insert(msg).second) log_warn("{}", msg);
}
}  // namespace

int plan_warnings_reported() {
  Warnings& w = warnings();
  std::lock_guard<std::mutex> lock(w.mu);
  return int(w.said.size());
}

Tactic plan_for(const PlanCache& cache, const GemmProblem& p, int64_t tokens, const ArchInfo& arch,
                const std::string& op) {
  const PlanEntry* e = cache.nearest(op, p, tokens);
  if (!e) return fallback_tactic(op);
  for (const TacticDef& d : tactics_for(op, p))
    if (d.tactic == e->best) {
      const Feasibility f = d.valid(p, arch);
      if (f.ok && !impl_is_listed_only(d.tactic.kernel)) return d.tactic;
      warn_once(fmt::format("plan cache {}: {} (bucket {}) is not valid for {} on {} ({}); using the default",
                            cache.path(), tactic_name(d.tactic), e->bucket, to_string(p), arch.name, f.reason()));
      return fallback_tactic(op);
    }
  warn_once(fmt::format("plan cache {}: tactic {} (bucket {}, {}) is unknown to this build; using the default",
                        cache.path(), tactic_name(e->best), e->bucket, to_string(p)));
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
      pp.cache = PlanCache(PlanCache::configured_path(), current_plan_key());
      pp.cache.load();
      pp.arch = device_arch();
    }
  }
  if (!pp.arch) return fallback_tactic(op);
  return plan_for(pp.cache, p, tokens, *pp.arch, op);
}

Tactic plan_for(const cuda::MoeGemmDesc& d, int64_t tokens, int top_k) {
  return plan_for(problem_of(d, top_k), tokens);
}

void reset_plan_for_cache() {
  ProcessPlans& pp = process_plans();
  std::lock_guard<std::mutex> lock(pp.mu);
  pp.loaded = false;
  pp.cache = PlanCache();
  pp.arch.reset();
}

}  // namespace fp4moe::tuner
