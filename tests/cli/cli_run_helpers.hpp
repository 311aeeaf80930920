// Helpers for end-to-end tests of the built `fp4moe` binary: a per-test temp folder and
// running a command line with its exit code, stdout and stderr captured.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace fp4moe::testing_cli {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
  long err_lines() const { return long(std::count(err.begin(), err.end(), '\n')); }
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline const std::string& binary() {
  static const std::string b = std::string(FP4MOE_BINARY_DIR) + "/bin/fp4moe";
  return b;
}

// A fresh temp folder named after the running test; removed by the destructor.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();  // null in SetUpTestSuite
    std::string name = info ? std::string("_") + info->name() : "";
    std::replace(name.begin(), name.end(), '/', '_');  // parameterized tests: "Name/param"
    path = fs::temp_directory_path() / ("fp4moe_" + tag + "_" + std::to_string(::getpid()) + name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

inline Result run_binary(const fs::path& scratch, const std::string& args) {
  const fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const std::string cmd = binary() + " " + args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A synthetic checkpoint (`make-synthetic DIR --preset PRESET [ARGS]`) made once per test binary
// in a temp folder tagged `tag` (removed at exit): its path. A failed make fails the calling test.
inline const std::string& synthetic_model(const std::string& tag, const std::string& preset,
                                          const std::string& args = "") {
  struct Made {
    std::unique_ptr<TempDir> dir;
    std::string path;
  };
  static std::map<std::string, Made> made;
  const std::string key = tag + "|" + preset + "|" + args;
  auto it = made.find(key);
  if (it == made.end()) {
    Made m;
    m.dir = std::make_unique<TempDir>(tag);
    const fs::path d = m.dir->path / preset;
    const Result r = run_binary(m.dir->path, "make-synthetic " + d.string() + " --preset " + preset +
                                                 (args.empty() ? "" : " " + args));
    EXPECT_EQ(r.rc, 0) << r.err;
    m.path = d.string();
    it = made.emplace(key, std::move(m)).first;
  }
  return it->second.path;
}

}  // namespace fp4moe::testing_cli
