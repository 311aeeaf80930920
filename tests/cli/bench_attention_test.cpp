// `fp4moe bench attention`: bad input gives one line and exit code 1 before any GPU work (so
// this runs without a GPU), unknown flags exit 2, --help works.
#include <gtest/gtest.h>

#include <string>

#include "cli_run_helpers.hpp"

namespace fp4moe::testing_cli {
namespace {

TEST(BenchAttentionCli, BadInputIsOneLineAndExitCode1) {
  TempDir dir("bench_attention");
  for (const char* args : {"--kv int8", "--page-size 48", "--top-k 0", "--top-k 5000", "--batch 0", "--ctx 0",
                           "--prefill 0", "--iters 0", "--l2-flush sideways"}) {
    const Result r = run_binary(dir.path, std::string("bench attention ") + args);
    EXPECT_EQ(r.rc, 1) << args << ": " << r.err;
    EXPECT_EQ(r.err_lines(), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("fp4moe: "), std::string::npos) << args;
  }
  EXPECT_EQ(run_binary(dir.path, "bench attention --no-such-flag").rc, 2);
}

TEST(BenchAttentionCli, HelpListsTheCases) {
  TempDir dir("bench_attention_help");
  const Result r = run_binary(dir.path, "bench attention --help");
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const char* flag : {"--batch", "--ctx", "--prefill", "--kv", "--page-size", "--top-k", "--json", "--l2-flush"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace fp4moe::testing_cli
