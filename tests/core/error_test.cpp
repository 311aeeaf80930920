// The one error path: FP4MOE_CHECK / FP4MOE_FAIL throw fp4moe::Error with the formatted message,
// build it only when the check fails, and format_braces (what the macros use in .cu files under
// nvcc) gives what fmt gives for the fields those files use.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"

namespace fp4moe {
namespace {

TEST(Error, CheckThrowsTheFormattedMessage) {
  try {
    FP4MOE_CHECK(1 + 1 == 3, "K = {} is not a multiple of {}", 100, 64);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "K = 100 is not a multiple of 64");
  }
  EXPECT_THROW(FP4MOE_FAIL("always"), Error);
}

TEST(Error, MessageIsBuiltOnlyWhenTheCheckFails) {
  int evaluated = 0;
  auto arg = [&] {
    ++evaluated;
    return std::string("costly");
  };
  for (int i = 0; i < 10; ++i) FP4MOE_CHECK(i >= 0, "never {}", arg());
  EXPECT_EQ(evaluated, 0);
  EXPECT_THROW(FP4MOE_CHECK(false, "now {}", arg()), Error);
  EXPECT_EQ(evaluated, 1);
}

TEST(Error, FormatBracesMatchesFmtForTheFieldsCudaFilesUse) {
  const int64_t big = int64_t(1) << 40;
  const uint8_t u8 = 7;
  const size_t sz = 4096;
  EXPECT_EQ(format_braces("permute: {} + {} experts; supported 1..{} in all", 256, 8, 1024),
            fmt::format("permute: {} + {} experts; supported 1..{} in all", 256, 8, 1024));
  EXPECT_EQ(format_braces("{} tokens, {} B, {} bytes {}", big, sz, u8, "text"),
            fmt::format("{} tokens, {} B, {} bytes {}", big, sz, u8, "text"));
  EXPECT_EQ(format_braces("{:.2f} ms {:.1f}", 1.23456, 2.0), fmt::format("{:.2f} ms {:.1f}", 1.23456, 2.0));
  EXPECT_EQ(format_braces("{{literal}} {}", true), fmt::format("{{literal}} {}", true));
  EXPECT_EQ(format_braces("no fields"), "no fields");
  EXPECT_EQ(format_braces("{} and {}", 1), "1 and {}");       // missing argument: the field stays visible
  EXPECT_EQ(format_braces("only {}", 1, 2), "only 1 2");      // surplus argument: appended
}

}  // namespace
}  // namespace fp4moe
