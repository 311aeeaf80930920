#include <atomic>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"

using namespace fp4moe;

TEST(Threads, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 7}) {
    std::vector<std::atomic<int>> hits(10007);
    parallel_for(int64_t(hits.size()), threads, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(Threads, ExceptionPropagates) {
  EXPECT_THROW(parallel_for(1000, 4, 1, [](int64_t b, int64_t) {
                 if (b >= 500) throw std::runtime_error("boom");
               }),
               std::runtime_error);
}

TEST(Core, DTypeNamesRoundTrip) {
  for (DType t : kAllDTypes) {
    auto back = dtype_from_name(dtype_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
    EXPECT_GT(dtype_size(t), 0u);
  }
  EXPECT_FALSE(dtype_from_name("F4").has_value());
}

TEST(Core, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3F82);
}

TEST(Core, CheckThrowsFormattedError) {
  try {
    FP4MOE_CHECK(1 + 1 == 3, "K = {} is not a multiple of {}", 33, 32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "K = 33 is not a multiple of 32");
  }
}
