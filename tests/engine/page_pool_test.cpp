#include <gtest/gtest.h>

#include "core/error.hpp"
#include "engine/page_pool.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;

TEST(PagePool, AllocateTakesAllOrNothing) {
  PagePool pool(4);
  std::vector<int32_t> a;
  EXPECT_TRUE(pool.allocate(3, a));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_FALSE(pool.allocate(2, a));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
  for (int32_t p : a) EXPECT_EQ(pool.ref_count(p), 1);
}

TEST(PagePool, PageIsFreeOnlyAtZeroReferences) {
  PagePool pool(2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(1, a));
  pool.retain(a[0]);
  pool.release(a[0]);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  pool.release(a[0]);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.ref_count(a[0]), 0);
}

TEST(PagePool, DoubleReleaseAndBadIdsThrow) {
  PagePool pool(2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(1, a));
  pool.release(a[0]);
  EXPECT_THROW(pool.release(a[0]), Error);
  EXPECT_THROW(pool.retain(a[0]), Error);
  EXPECT_THROW(pool.release(7), Error);
  EXPECT_THROW(PagePool(0), Error);
}

TEST(PagePool, PagesForTokensRoundsUp) {
  EXPECT_EQ(pages_for_tokens(0, 16), 0);
  EXPECT_EQ(pages_for_tokens(1, 16), 1);
  EXPECT_EQ(pages_for_tokens(16, 16), 1);
  EXPECT_EQ(pages_for_tokens(17, 16), 2);
}
