// The plan cache: per GPU (name, SM count, driver, CUDA runtime) and kernel code (a hash of
// every implementation's and weight layout's identity: tactic.hpp registry_key), per op and
// problem (N, K, E, weight format, activations, epilogue) and per tokens bucket (powers of
// two of the total tokens): the tactic that measured fastest, with the times of all.
//
// Stored as JSON at $FP4MOE_PLAN_CACHE, else $XDG_CACHE_HOME/fp4moe/plans.json, else
// ~/.cache/fp4moe/plans.json (configured_path: `fp4moe tune` writes where the MoE layer reads),
// or an explicit path. A file whose key does not match this GPU/software, or that does not
// parse, is ignored with a warning (and replaced at the next save). Saves are atomic and
// durable (a temporary file in the same folder, fsync, rename, fsync of the folder) and
// merge: under an exclusive lock on "<path>.lock" the file's current entries that this cache
// lacks are kept, so concurrent `tune` runs do not lose each other's entries.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tuner/tactic.hpp"

namespace fp4moe::tuner {

struct PlanKey {
  std::string gpu_name;     // "NVIDIA H200"
  int sm_count = 0;
  int driver_version = 0;   // 13000
  int runtime_version = 0;
  std::string kernels = registry_key(kernel_identities("moe-gemm"));  // this build's kernel code
  bool operator==(const PlanKey&) const = default;
};
std::string to_string(const PlanKey& k);
// The key of this process on `device`: from device_arch(); without a device, the GPU fields empty.
PlanKey current_plan_key(int device = 0);

// Tokens bucket: the power of two at or above `tokens` (1, 2, 4, ... ; 0 -> 1).
int64_t tokens_bucket(int64_t tokens);

struct TacticTiming {
  std::string tactic;        // tactic_name()
  double median_us = 0;
  double tflops = 0, gbps = 0;
};

struct PlanEntry {
  std::string op = "moe-gemm";
  int n = 0, k = 0, num_experts = 0;
  WeightFormat weight = WeightFormat::NVFP4;
  ActFormat act = ActFormat::BF16;
  Epilogue epilogue = Epilogue::None;
  int64_t bucket = 0;        // tokens bucket
  Tactic best;
  double best_us = 0;
  std::vector<TacticTiming> timings;  // every tactic that ran, fastest first
  bool same_problem(const std::string& op_, const GemmProblem& p) const;
};

class PlanCache {
 public:
  // $XDG_CACHE_HOME/fp4moe/plans.json, else $HOME/.cache/fp4moe/plans.json.
  static std::string default_path();
  // $FP4MOE_PLAN_CACHE when set, else default_path(): where `fp4moe tune` writes and the layer reads.
  static std::string configured_path();

  PlanCache() = default;
  PlanCache(std::string path, PlanKey key) : path_(std::move(path)), key_(std::move(key)) {}

  // Reads the file. Missing: empty, silently. Corrupt or stale (key mismatch): log_warn, empty.
  // Returns whether entries were loaded.
  bool load();
  // Under an exclusive lock of "<path>.lock": adds the entries of the file as it is now (same
  // key) that this cache does not have, then writes all of them atomically and durably (temp,
  // fsync, rename, fsync of the folder), creating the folder. Throws on I/O errors.
  void save();

  // Adds or replaces the entry of (op, problem, bucket).
  void put(PlanEntry e);
  // The entry for exactly this bucket, if tuned.
  const PlanEntry* find(const std::string& op, const GemmProblem& p, int64_t bucket) const;
  // The entry of the tuned bucket nearest to `tokens` (in log2; ties go to the larger bucket).
  const PlanEntry* nearest(const std::string& op, const GemmProblem& p, int64_t tokens) const;

  const std::vector<PlanEntry>& entries() const { return entries_; }
  const std::string& path() const { return path_; }
  const PlanKey& key() const { return key_; }

 private:
  std::string path_;
  PlanKey key_;
  std::vector<PlanEntry> entries_;
};

// The lookup the MoE layer calls once per tokens bucket when it is built: the tuned tactic
// for (problem, tokens) from the nearest tuned bucket of this GPU's plan cache (loaded once,
// from configured_path()), re-checked with valid() on this GPU; else the fallback, which
// accepts any shape. A stored tactic that is unknown or not valid here is reported once per
// process (log_warn), not at every lookup.
Tactic plan_for(const GemmProblem& p, int64_t tokens, const std::string& op = "moe-gemm");
// Same, against an explicit cache (tests) and architecture.
Tactic plan_for(const PlanCache& cache, const GemmProblem& p, int64_t tokens, const ArchInfo& arch,
                const std::string& op = "moe-gemm");
// The same lookup for a kernel descriptor (the MoE layer's): a TileConfig whose kernel is
// GemmKernel::Generic (the fallback) when nothing is tuned for it.
Tactic plan_for(const cuda::MoeGemmDesc& d, int64_t tokens, int top_k);
// How many distinct stale / invalid stored tactics this process has reported (tests).
int plan_warnings_reported();
// Drops the process-wide cache so the next plan_for reloads it (after `fp4moe tune`).
void reset_plan_for_cache();

}  // namespace fp4moe::tuner
