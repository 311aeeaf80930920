// `fp4moe bench gemm`: bad input gives one line and exit code 1 (no GPU needed), and the
// routing counts equal bench/torch_grouped_mm.py's (same generator in C++ and numpy).
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "cli_run_helpers.hpp"

namespace fp4moe::testing_cli {
namespace {

TEST(BenchGemmCli, BadInputIsOneLineAndExitCode1) {
  TempDir dir("bench_gemm");
  for (const char* args : {"--op foo", "--tokens 0", "--configs x", "--iters 0", "--torch-json /nonexistent/x.json",
                           "--l2-flush sideways"}) {
    const Result r = run_binary(dir.path, std::string("bench gemm ") + args);
    EXPECT_EQ(r.rc, 1) << args << ": " << r.err;
    EXPECT_EQ(r.err_lines(), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("fp4moe: "), std::string::npos) << args;
  }
  const Result r = run_binary(dir.path, "bench gemm --no-such-flag");
  EXPECT_EQ(r.rc, 2);
}

TEST(BenchGemmCli, RoutingCountsMatchTheTorchScript) {
  TempDir dir("bench_gemm_routing");
  const Result r = run_binary(dir.path, "bench gemm --routing-only --tokens 1,8,128,1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    std::istringstream ls(line);
    std::string t;
    ls >> t;
    long sum = 0, c;
    int experts = 0;
    while (ls >> c) sum += c, ++experts;
    EXPECT_EQ(experts, 256) << line;
    EXPECT_EQ(sum, 8 * std::stol(t)) << line;  // top-8: 8 slots per token
    ++n;
  }
  EXPECT_EQ(n, 4);

  // The same counts from numpy (skip where python3 + numpy are missing, e.g. minimal CI).
  const fs::path py = dir.path / "counts.txt";
  const std::string cmd = std::string("python3 -c \"import sys; sys.path.insert(0, '") + FP4MOE_SOURCE_DIR +
                          "/bench'); from torch_grouped_mm import routing_counts\n"
                          "for t in (1, 8, 128, 1000): print(str(t) + ':' + ''.join(' %d' % c for c in routing_counts(t)))\" >" +
                          py.string() + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "python3 with numpy not available";
  EXPECT_EQ(slurp(py), r.out);
}

}  // namespace
}  // namespace fp4moe::testing_cli
