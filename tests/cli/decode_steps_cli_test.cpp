// The decode-step flags either run the path they promise or are refused at start-up (issue 38,
// item 7): `serve --num-continuous-decode-steps` outside 1 .. 1024 and `bench step --k` outside
// 1 .. 64 (the runner is sized for the largest value asked) exit 2 naming the flag, before any
// model or GPU work, so this runs without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "cli_run_helpers.hpp"

namespace fp4moe::testing_cli {
namespace {

TEST(DecodeStepsCli, OutOfRangeValuesAreRefusedNamingTheFlag) {
  TempDir dir("decode_steps");
  for (const char* args : {"serve --model m --num-continuous-decode-steps 0",
                           "serve --model m --num-continuous-decode-steps 1025",
                           "bench step --model m --k 65", "bench step --model m --k 0", "bench step --model m --k 1,8,65"}) {
    const Result r = run_binary(dir.path, args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    const std::string flag = std::string(args).find("bench") == 0 ? "--k" : "--num-continuous-decode-steps";
    EXPECT_NE(r.err.find(flag + ": Value"), std::string::npos) << args << ": " << r.err;
  }
}

TEST(DecodeStepsCli, HelpSaysTheRanges) {
  TempDir dir("decode_steps_help");
  const Result r = run_binary(dir.path, "bench step --help");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("1 .. 64"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace fp4moe::testing_cli
