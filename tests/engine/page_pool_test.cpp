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

TEST(PagePool, CountsIndexedPagesThatOnlyTheIndexReferences) {
  PagePool pool(4);
  std::vector<int32_t> p;
  ASSERT_TRUE(pool.allocate(2, p));  // a request holds both
  pool.retain(p[0]);                 // the index takes its reference, then marks
  pool.set_indexed(p[0], true);
  EXPECT_EQ(pool.num_indexed_sole(), 0);  // the request still holds it
  pool.release(p[0]);                     // the request finishes
  EXPECT_EQ(pool.num_indexed_sole(), 1);
  pool.retain(p[0]);  // another request reuses the prefix
  EXPECT_EQ(pool.num_indexed_sole(), 0);
  pool.release(p[0]);
  EXPECT_EQ(pool.num_indexed_sole(), 1);
  pool.set_indexed(p[1], true);  // marked while its count is 1
  EXPECT_EQ(pool.num_indexed_sole(), 2);
  pool.set_indexed(p[0], false);  // evicted: unmark, then drop the index's reference
  pool.release(p[0]);
  EXPECT_EQ(pool.num_indexed_sole(), 1);
  EXPECT_EQ(pool.num_free(), 3);
}

TEST(PagePool, FreeingAnIndexedPageOrMarkingTwiceThrows) {
  PagePool pool(2);
  std::vector<int32_t> p;
  ASSERT_TRUE(pool.allocate(1, p));
  pool.set_indexed(p[0], true);
  EXPECT_THROW(pool.set_indexed(p[0], true), fp4moe::Error);
  EXPECT_THROW(pool.release(p[0]), fp4moe::Error);
  EXPECT_THROW(pool.set_indexed(1, true), fp4moe::Error);  // free page
}
