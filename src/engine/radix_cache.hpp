// Prefix reuse: a radix tree whose edges are page-aligned token runs (one page of
// page_size tokens per edge), each node naming the KV page that holds its run.
//
// The tree holds one pool reference per node. A request that reuses a cached prefix holds
// its own reference on each page of it, so a node whose page count is 1 is referenced by
// nobody but the tree; because page tables are prefixes, its whole subtree is then
// unreferenced too. Eviction frees such pages leaf first, least recently used first.
//
// The leaves only the tree references are kept in LRU order as they change (the pool reports
// every indexed page whose count moves to or from 1), so evict() takes them from the front
// instead of walking the tree: an allocation under a full pool costs O(log n), not O(n).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "engine/page_pool.hpp"

namespace fp4moe::engine {

class RadixCache {
 public:
  RadixCache(PagePool& pool, int32_t page_size);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // The longest cached run of at most max_pages whole pages that prefixes tokens; appends
  // its page ids to pages, retained for the caller. Returns the number of pages matched.
  int32_t match(std::span<const int32_t> tokens, int32_t max_pages, std::vector<int32_t>& pages);

  // Indexes the first n_pages whole pages of tokens, whose KV is in pages[0..n_pages). Where a
  // run is cached already under another page, pages[i] becomes the cached page: the caller's
  // reference moves to it and its own duplicate page is released.
  void insert(std::span<const int32_t> tokens, int32_t n_pages, std::vector<int32_t>& pages);

  // Frees up to n pages that only the tree references; returns how many it freed.
  int32_t evict(int32_t n);
  int32_t evict_all() { return evict(INT32_MAX); }

  int32_t num_nodes() const { return num_nodes_; }
  // Calls fn(page) for every page the tree indexes.
  void for_each_page(const std::function<void(int32_t)>& fn) const;
  // Pages only the tree references (what evict could free): O(1), kept by the pool.
  int32_t num_evictable() const;
  // The same count by walking the tree (check_invariants and tests).
  int32_t count_evictable_by_walk() const;
  // Leaves evict() can take now (kept as they change), and the same by walking the tree.
  int32_t num_evictable_leaves() const { return int32_t(lru_.size()); }
  int32_t count_evictable_leaves_by_walk() const;

 private:
  struct Node;
  // Puts x into, or takes it out of, lru_ to match whether it is evictable now (a leaf, not the
  // root, whose page only the tree holds), keyed by its current last use.
  void refresh(Node* x);
  // Nodes whose page only the tree holds (leaves only, or all), by walking the tree.
  int32_t count_sole_by_walk(bool leaves_only) const;
  PagePool& pool_;
  int32_t page_size_;
  std::unique_ptr<Node> root_;
  std::vector<Node*> node_of_page_;                         // indexed page -> its node
  std::set<std::tuple<uint64_t, int32_t, Node*>> lru_;      // (last use, page, node): evictable leaves
  int32_t num_nodes_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace fp4moe::engine
