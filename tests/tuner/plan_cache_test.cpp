// The plan cache: round trip, atomic writes, corrupt and stale files (the key follows the
// kernels' identities), concurrent saves from threads and processes, nearest-bucket lookup,
// the fallback that always exists, and a stale stored tactic reported once.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "tuner/plan_cache.hpp"
#include "tuner/tune_report.hpp"

using namespace fp4moe;
using namespace fp4moe::tuner;
namespace fs = std::filesystem;

namespace {

class PlanCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("fp4moe_plan_test_" + std::to_string(rd()));
    fs::create_directories(dir_);
    path_ = (dir_ / "sub" / "plans.json").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static PlanKey key() {
    PlanKey k;
    k.gpu_name = "NVIDIA H200";
    k.sm_count = 132;
    k.driver_version = 13000;
    k.runtime_version = 13000;
    return k;
  }
  static GemmProblem problem() { return preset_problems("glm5")[0]; }
  static PlanEntry entry(int64_t bucket, Tactic best, double us) {
    const GemmProblem p = problem();
    PlanEntry e;
    e.n = p.n;
    e.k = p.k;
    e.num_experts = p.num_experts;
    e.weight = p.weight;
    e.act = p.act;
    e.epilogue = p.epilogue;
    e.bucket = bucket;
    e.best = best;
    e.best_us = us;
    e.timings = {{tactic_name(best), us, 1.5, 2.5}, {"generic", us * 3, 0.5, 0.8}};
    return e;
  }
  static Tactic sm90(int bn, int stages) { return Tactic{GemmKernel::Sm90Wgmma, 128, bn, 64, stages, 1, 1}; }
  void write(const std::string& text) {
    fs::create_directories(fs::path(path_).parent_path());
    std::ofstream(path_) << text;
  }

  fs::path dir_;
  std::string path_;
};

}  // namespace

TEST_F(PlanCacheTest, RoundTripKeepsEveryField) {
  PlanCache c(path_, key());
  EXPECT_FALSE(c.load());  // missing file: empty, no warning needed
  c.put(entry(1, sm90(16, 8), 31.5));
  c.put(entry(128, sm90(64, 8), 850.25));
  c.put(entry(8192, sm90(256, 6), 5123.0));
  c.put(entry(128, sm90(128, 4), 800.0));  // replaces bucket 128
  ASSERT_EQ(c.entries().size(), 3u);
  c.save();
  for (const auto& f : fs::directory_iterator(fs::path(path_).parent_path()))
    EXPECT_TRUE(f.path().string() == path_ || f.path().string() == path_ + ".lock")
        << "left a temporary file behind: " << f.path();

  PlanCache d(path_, key());
  ASSERT_TRUE(d.load());
  ASSERT_EQ(d.entries().size(), 3u);
  const PlanEntry* e = d.find("moe-gemm", problem(), 128);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->best, sm90(128, 4));
  EXPECT_DOUBLE_EQ(e->best_us, 800.0);
  ASSERT_EQ(e->timings.size(), 2u);
  EXPECT_EQ(e->timings[0].tactic, "sm90-wgmma 128x128x64 s4");
  EXPECT_DOUBLE_EQ(e->timings[1].median_us, 2400.0);
  EXPECT_EQ(e->epilogue, Epilogue::SiluMul);
  EXPECT_EQ(d.find("moe-gemm", problem(), 64), nullptr);
  GemmProblem other = problem();
  other.epilogue = Epilogue::None;
  EXPECT_EQ(d.find("moe-gemm", other, 128), nullptr);
}

TEST_F(PlanCacheTest, CorruptFilesAreIgnoredAndRebuilt) {
  for (const std::string& junk : {std::string("not json at all {"), std::string("{\"format\": \"fp4moe-plans/2\"}"), std::string("{\"format\": \"fp4moe-plans/1\"}"),
                                  std::string("[1, 2, 3]"), std::string(""),
                                  std::string("{\"format\":\"fp4moe-plans/2\",\"key\":{\"gpu\":\"NVIDIA H200\","
                                              "\"sm_count\":132,\"driver\":13000,\"runtime\":13000,\"kernels\":\"" +
                                              key().kernels + "\"},\"entries\":[{\"op\":\"moe-gemm\",\"n\":\"x\"}]}")}) {
    write(junk);
    PlanCache c(path_, key());
    EXPECT_NO_THROW(EXPECT_FALSE(c.load())) << junk;
    EXPECT_TRUE(c.entries().empty());
    c.put(entry(1, sm90(16, 8), 30));
    c.save();  // rebuilt over the corrupt file
    PlanCache d(path_, key());
    EXPECT_TRUE(d.load());
    EXPECT_EQ(d.entries().size(), 1u);
  }
}

TEST_F(PlanCacheTest, StaleKeyIsIgnored) {
  PlanCache c(path_, key());
  c.put(entry(1, sm90(16, 8), 30));
  c.save();
  for (int field = 0; field < 5; ++field) {
    PlanKey k = key();
    if (field == 0) k.gpu_name = "NVIDIA H100 80GB HBM3";
    if (field == 1) k.sm_count = 114;
    if (field == 2) k.driver_version = 12080;
    if (field == 3) k.runtime_version = 12080;
    if (field == 4) k.kernels = "0123456789abcdef";  // other kernel code
    PlanCache d(path_, k);
    EXPECT_FALSE(d.load()) << field;
    EXPECT_TRUE(d.entries().empty());
  }
  PlanCache same(path_, key());
  EXPECT_TRUE(same.load());
}

TEST_F(PlanCacheTest, NearestTunedBucketInLog2) {
  PlanCache c(path_, key());
  c.put(entry(1, sm90(16, 8), 30));
  c.put(entry(128, sm90(64, 8), 800));
  c.put(entry(8192, sm90(256, 6), 5000));
  auto bucket_for = [&](int64_t tokens) { return c.nearest("moe-gemm", problem(), tokens)->bucket; };
  EXPECT_EQ(bucket_for(1), 1);
  EXPECT_EQ(bucket_for(3), 1);
  EXPECT_EQ(bucket_for(16), 128);      // log2 4 vs 7: 3 from 128, 4 from 1 -> 128
  EXPECT_EQ(bucket_for(11), 1);        // 3.46 from 1, 3.54 from 128
  EXPECT_EQ(bucket_for(100), 128);
  EXPECT_EQ(bucket_for(1024), 8192);   // tie (3 and 3): the larger bucket
  EXPECT_EQ(bucket_for(2048), 8192);
  EXPECT_EQ(bucket_for(1 << 20), 8192);
  EXPECT_EQ(tokens_bucket(0), 1);
  EXPECT_EQ(tokens_bucket(1), 1);
  EXPECT_EQ(tokens_bucket(129), 256);
  EXPECT_EQ(tokens_bucket(8192), 8192);
}

TEST_F(PlanCacheTest, PlanForUsesTheNearestBucketAndFallsBack) {
  const ArchInfo& sm90a = arch_by_name("sm_90");
  PlanCache empty(path_, key());
  EXPECT_EQ(plan_for(empty, problem(), 64, sm90a), fallback_tactic("moe-gemm"));  // nothing tuned

  PlanCache c(path_, key());
  c.put(entry(1, sm90(16, 4), 30));
  c.put(entry(8192, sm90(256, 4), 5000));
  EXPECT_EQ(plan_for(c, problem(), 2, sm90a), sm90(16, 4));
  EXPECT_EQ(plan_for(c, problem(), 6000, sm90a), sm90(256, 4));
  // An untuned problem: the fallback.
  GemmProblem other = problem();
  other.n = 1024;
  EXPECT_EQ(plan_for(c, other, 1, sm90a), fallback_tactic("moe-gemm"));
  // A plan that is not valid on this architecture (sm90 kernel on sm_120): the fallback.
  EXPECT_EQ(plan_for(c, problem(), 1, arch_by_name("sm_120")), fallback_tactic("moe-gemm"));
  // A tactic this build does not know (a config that is not in the registry): the fallback.
  PlanCache odd(path_, key());
  odd.put(entry(1, sm90(16, 3), 30));
  EXPECT_EQ(plan_for(odd, problem(), 1, sm90a), fallback_tactic("moe-gemm"));
  // A listed-only Blackwell tactic is never returned.
  PlanCache listed(path_, key());
  listed.put(entry(1, Tactic{GemmKernel::Sm120MmaBlockScaled, 128, 128, 128, 2, 1, 1}, 30));
  EXPECT_EQ(plan_for(listed, problem(), 1, arch_by_name("sm_120")), fallback_tactic("moe-gemm"));
}

TEST_F(PlanCacheTest, DefaultPathFollowsXdgCacheHome) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  EXPECT_EQ(PlanCache::default_path(), (dir_ / "fp4moe" / "plans.json").string());
  unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home && *home) {
    EXPECT_EQ(PlanCache::default_path(), (fs::path(home) / ".cache" / "fp4moe" / "plans.json").string());
  }
  if (old) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST_F(PlanCacheTest, ProcessWidePlanForWithoutTuningIsTheFallback) {
  setenv("FP4MOE_PLAN_CACHE", (dir_ / "none.json").c_str(), 1);
  reset_plan_for_cache();
  EXPECT_EQ(plan_for(problem(), 128), fallback_tactic("moe-gemm"));
  unsetenv("FP4MOE_PLAN_CACHE");
  reset_plan_for_cache();
}

TEST_F(PlanCacheTest, SaveToAnUnwritablePlaceIsAClearError) {
  write("x");
  PlanCache c((fs::path(path_) / "under_a_file.json").string(), key());  // parent is a regular file
  c.put(entry(1, sm90(16, 8), 30));
  EXPECT_THROW(c.save(), Error);
}

// The key follows the kernels: changing any implementation's kernel or weight-layout identity
// changes it, and a plan saved under the old one is stale.
TEST_F(PlanCacheTest, KeyChangesWhenAKernelIdentityChanges) {
  const std::vector<KernelIdentity> ids = kernel_identities("moe-gemm");
  ASSERT_GE(ids.size(), 4u);
  const std::string k0 = registry_key(ids);
  EXPECT_EQ(PlanKey{}.kernels, k0) << "the default key is this build's";
  EXPECT_EQ(current_plan_key().kernels, k0);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int field = 0; field < 2; ++field) {
      std::vector<KernelIdentity> changed = ids;
      (field == 0 ? changed[i].kernel_id : changed[i].layout_id) += "x";
      EXPECT_NE(registry_key(changed), k0) << impl_name(ids[i].gemm) << (field == 0 ? " kernel" : " layout");
    }
  for (const KernelIdentity& id : ids) {
    EXPECT_EQ(id.kernel_id.size(), 16u) << impl_name(id.gemm) << ": a configure-time source hash";
    EXPECT_FALSE(id.layout_id.empty());
  }
  PlanCache c(path_, key());
  c.put(entry(1, sm90(16, 8), 30));
  c.save();
  std::vector<KernelIdentity> newer = ids;
  newer[0].kernel_id = "ffffffffffffffff";  // the wgmma kernel changed
  PlanKey k = key();
  k.kernels = registry_key(newer);
  PlanCache d(path_, k);
  EXPECT_FALSE(d.load()) << "a plan tuned on other kernel code must be stale";
}

// Concurrent saves (threads here, each with its own cache and lock file descriptor) merge: no
// save loses another's entries.
TEST_F(PlanCacheTest, ConcurrentSavesFromThreadsKeepEveryEntry) {
  constexpr int kThreads = 4, kSaves = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([this, t] {
      PlanCache c(path_, key());
      for (int i = 0; i < kSaves; ++i) {
        c.put(entry(int64_t(1) << (t * kSaves + i), sm90(16, 8), 30 + i));
        c.save();
      }
    });
  for (std::thread& th : threads) th.join();
  PlanCache all(path_, key());
  ASSERT_TRUE(all.load());
  EXPECT_EQ(all.entries().size(), size_t(kThreads * kSaves));
}

// The same across processes (two `fp4moe tune` runs at once).
TEST_F(PlanCacheTest, ConcurrentSavesFromProcessesKeepEveryEntry) {
  constexpr int kProcs = 3, kSaves = 6;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        PlanCache c(path_, key());
        for (int i = 0; i < kSaves; ++i) {
          c.put(entry(int64_t(1) << (p * kSaves + i), sm90(16, 8), 30 + i));
          c.save();
        }
      } catch (...) {
        rc = 1;
      }
      _exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  PlanCache all(path_, key());
  ASSERT_TRUE(all.load());
  EXPECT_EQ(all.entries().size(), size_t(kProcs * kSaves));
}

// A stored tactic this build does not know (or that is not valid here) is reported once per
// process, however often it is looked up; the lookup falls back every time.
TEST_F(PlanCacheTest, StaleTacticIsReportedOnce) {
  PlanCache c(path_, key());
  c.put(entry(64, sm90(16, 3), 30));  // no such config in the registry
  const int before = plan_warnings_reported();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(plan_for(c, problem(), 64, arch_by_name("sm_90")), fallback_tactic("moe-gemm"));
  EXPECT_EQ(plan_warnings_reported(), before + 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(plan_for(c, problem(), 64, arch_by_name("sm_120")), fallback_tactic("moe-gemm"));
  EXPECT_EQ(plan_warnings_reported(), before + 1) << "the same stale entry, looked up again";
  PlanCache invalid(path_, key());
  invalid.put(entry(64, sm90(16, 4), 30));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(plan_for(invalid, problem(), 64, arch_by_name("sm_120")), fallback_tactic("moe-gemm"));
  EXPECT_EQ(plan_warnings_reported(), before + 2) << "an sm90 plan on sm_120: reported once";
}

// `fp4moe tune` writes where the layer reads: FP4MOE_PLAN_CACHE when set.
TEST_F(PlanCacheTest, ConfiguredPathFollowsTheEnvironment) {
  const std::string want = (dir_ / "mine.json").string();
  setenv("FP4MOE_PLAN_CACHE", want.c_str(), 1);
  EXPECT_EQ(PlanCache::configured_path(), want);
  unsetenv("FP4MOE_PLAN_CACHE");
  EXPECT_EQ(PlanCache::configured_path(), PlanCache::default_path());
}
