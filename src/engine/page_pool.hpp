// The KV page pool: page ids 0..num_pages-1 with a free list and a reference count each.
//
// A page is free at count 0. Whoever puts a page id into a page table holds one reference:
// a running request for each page of its table, the prefix cache for each page it indexes.
// The pool knows nothing about what a page holds (the backend owns the KV memory).
//
// The prefix cache marks the pages it indexes (set_indexed); the pool keeps the count of marked
// pages that nobody else references (count 1), so "pages the cache could free" costs O(1)
// instead of a walk of the whole tree on every scheduling round.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace fp4moe::engine {

class PagePool {
 public:
  explicit PagePool(int32_t num_pages);

  int32_t num_pages() const { return int32_t(refs_.size()); }
  int32_t num_free() const { return int32_t(free_.size()); }

  // Appends n fresh pages (count 1 each) to out; false and nothing taken when fewer are free.
  bool allocate(int32_t n, std::vector<int32_t>& out);
  void retain(int32_t page);
  // Drops one reference; the page returns to the free list at 0.
  void release(int32_t page);
  void release(std::span<const int32_t> pages);

  int32_t ref_count(int32_t page) const;

  // Marks / unmarks a page (holding a reference) as indexed by the prefix cache.
  void set_indexed(int32_t page, bool indexed);
  bool indexed(int32_t page) const;
  // Indexed pages whose only reference is the index's own.
  int32_t num_indexed_sole() const { return indexed_sole_; }
  // Called with an indexed page whenever retain / release makes the index its only holder or
  // ends that (the prefix cache keeps its evictable leaves with it); null: none.
  void set_sole_listener(std::function<void(int32_t)> fn) { on_sole_ = std::move(fn); }

 private:
  std::vector<int32_t> refs_;
  std::vector<uint8_t> indexed_;
  int32_t indexed_sole_ = 0;
  std::function<void(int32_t)> on_sole_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
};

inline int32_t pages_for_tokens(int64_t tokens, int32_t page_size) {
  return int32_t((tokens + page_size - 1) / page_size);
}

}  // namespace fp4moe::engine
