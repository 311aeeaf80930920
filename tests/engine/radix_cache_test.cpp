#include <numeric>

#include <gtest/gtest.h>

#include "engine/radix_cache.hpp"

using namespace fp4moe::engine;

namespace {

std::vector<int32_t> seq(int32_t n, int32_t first = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A request's page table for tokens: matched pages, then fresh ones.
std::vector<int32_t> table_for(PagePool& pool, RadixCache& cache, const std::vector<int32_t>& tokens, int32_t page,
                               int32_t& matched) {
  std::vector<int32_t> pages;
  matched = cache.match(tokens, int32_t(tokens.size()) / page, pages);
  EXPECT_TRUE(pool.allocate(pages_for_tokens(int64_t(tokens.size()), page) - matched, pages));
  return pages;
}

}  // namespace

TEST(RadixCache, SharesIdenticalPageAlignedPrefixes) {
  PagePool pool(16);
  RadixCache cache(pool, 4);
  auto a = seq(10);  // 2 full pages + 2 tokens
  int32_t m = 0;
  auto pa = table_for(pool, cache, a, 4, m);
  EXPECT_EQ(m, 0);
  cache.insert(a, 2, pa);
  EXPECT_EQ(cache.num_nodes(), 2);

  auto b = seq(12);  // same first 8 tokens, then 8..11
  auto pb = table_for(pool, cache, b, 4, m);
  EXPECT_EQ(m, 2);
  EXPECT_EQ(pb[0], pa[0]);
  EXPECT_EQ(pb[1], pa[1]);
  EXPECT_NE(pb[2], pa[2]);
  EXPECT_EQ(pool.ref_count(pa[0]), 3);  // cache + a + b

  auto c = seq(8, 1);  // differs at token 0: no match
  std::vector<int32_t> pc;
  EXPECT_EQ(cache.match(c, 2, pc), 0);
  EXPECT_TRUE(pc.empty());

  // max_pages caps the match.
  std::vector<int32_t> pd;
  EXPECT_EQ(cache.match(b, 1, pd), 1);
  pool.release(pd);
  pool.release(pa);
  pool.release(pb);
}

TEST(RadixCache, InsertOfADuplicateRunMovesTheReferenceToTheCachedPage) {
  PagePool pool(8);
  RadixCache cache(pool, 2);
  auto t = seq(4);
  std::vector<int32_t> p1, p2;
  ASSERT_TRUE(pool.allocate(2, p1));
  ASSERT_TRUE(pool.allocate(2, p2));  // computed the same prefix concurrently
  cache.insert(t, 2, p1);
  const auto dup = p2;
  cache.insert(t, 2, p2);
  EXPECT_EQ(p2, p1);
  EXPECT_EQ(pool.ref_count(dup[0]), 0);  // the duplicates went back to the pool
  EXPECT_EQ(pool.ref_count(p1[0]), 3);
  EXPECT_EQ(cache.num_nodes(), 2);
  pool.release(p1);
  pool.release(p2);
  EXPECT_EQ(cache.num_evictable(), 2);
  EXPECT_EQ(cache.evict_all(), 2);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(RadixCache, EvictsUnreferencedLeavesLeastRecentlyUsedFirst) {
  PagePool pool(8);
  RadixCache cache(pool, 2);
  auto a = std::vector<int32_t>{1, 1, 2, 2};
  auto b = std::vector<int32_t>{1, 1, 3, 3};
  std::vector<int32_t> pa, pb;
  ASSERT_TRUE(pool.allocate(2, pa));
  cache.insert(a, 2, pa);
  int32_t m = 0;
  pb = table_for(pool, cache, b, 2, m);
  ASSERT_EQ(m, 1);
  cache.insert(b, 2, pb);
  pool.release(pa);
  pool.release(pb);
  EXPECT_EQ(cache.num_nodes(), 3);
  EXPECT_EQ(cache.num_evictable(), 3);
  // Touch a: b's leaf is now the least recently used.
  std::vector<int32_t> touch;
  EXPECT_EQ(cache.match(a, 2, touch), 2);
  pool.release(touch);
  const int32_t b_leaf = pb[1];
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.ref_count(b_leaf), 0);
  std::vector<int32_t> again;
  EXPECT_EQ(cache.match(a, 2, again), 2);  // a survived
  pool.release(again);
  // The shared first page goes only after its last child.
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(cache.num_nodes(), 1);
  EXPECT_EQ(cache.evict(5), 1);
  EXPECT_EQ(cache.num_nodes(), 0);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(RadixCache, NeverEvictsPagesARequestHolds) {
  PagePool pool(4);
  RadixCache cache(pool, 2);
  auto t = seq(6);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.allocate(3, pages));
  cache.insert(t, 3, pages);
  EXPECT_EQ(cache.num_evictable(), 0);
  EXPECT_EQ(cache.evict_all(), 0);
  pool.release(pages[2]);  // the request lets go of its last page only (as if it were shorter)
  EXPECT_EQ(cache.num_evictable(), 1);
  EXPECT_EQ(cache.evict_all(), 1);
  EXPECT_EQ(pool.ref_count(pages[0]), 2);
  pool.release(pages[0]);
  pool.release(pages[1]);
  EXPECT_EQ(cache.evict_all(), 2);
  EXPECT_EQ(pool.num_free(), 4);
}

// num_evictable() (kept by the pool) and the evictable leaves (kept in LRU order by the cache)
// over random requests (shared prefixes, matches, inserts, finishes, evictions): both equal the
// walk of the tree after every operation.
TEST(RadixCache, EvictableCountsMatchTheTreeWalkOverRandomRequests) {
  const int32_t page = 2;
  PagePool pool(64);
  RadixCache cache(pool, page);
  std::vector<std::vector<int32_t>> live;  // page tables of running requests
  uint64_t rng = 12345;
  auto next = [&rng](uint32_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return uint32_t(rng >> 33) % n;
  };
  for (int op = 0; op < 2000; ++op) {
    if (live.size() < 6 && next(3) != 0) {  // a new request: 1..5 pages from a small alphabet
      std::vector<int32_t> tokens(size_t(page) * (1 + next(5)));
      for (auto& t : tokens) t = int32_t(next(2));
      std::vector<int32_t> pages;
      const int32_t matched = cache.match(tokens, int32_t(tokens.size()) / page, pages);
      const int32_t need = int32_t(tokens.size()) / page - matched;
      if (pool.num_free() < need) cache.evict(need - pool.num_free());
      if (!pool.allocate(need, pages)) {
        pool.release(pages);
        continue;
      }
      cache.insert(tokens, int32_t(tokens.size()) / page, pages);
      live.push_back(std::move(pages));
    } else if (!live.empty()) {  // a request finishes
      const size_t i = next(uint32_t(live.size()));
      pool.release(live[i]);
      live.erase(live.begin() + int64_t(i));
    }
    if (next(10) == 0) cache.evict(int32_t(next(4)));
    ASSERT_EQ(cache.num_evictable(), cache.count_evictable_by_walk()) << "after operation " << op;
    ASSERT_EQ(cache.num_evictable_leaves(), cache.count_evictable_leaves_by_walk()) << "after operation " << op;
  }
  for (auto& p : live) pool.release(p);
  EXPECT_EQ(cache.num_evictable(), cache.num_nodes());
  cache.evict_all();
  EXPECT_EQ(pool.num_free(), 64);
}
