#include "engine/page_pool.hpp"

#include "core/error.hpp"

namespace fp4moe::engine {

PagePool::PagePool(int32_t num_pages) {
  FP4MOE_CHECK(num_pages > 0, "the KV pool needs at least one page (got {})", num_pages);
  refs_.assign(size_t(num_pages), 0);
  indexed_.assign(size_t(num_pages), 0);
  free_.reserve(size_t(num_pages));
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);  // page 0 comes out first
}

bool PagePool::allocate(int32_t n, std::vector<int32_t>& out) {
  FP4MOE_CHECK(n >= 0, "negative page count {}", n);
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    out.push_back(p);
  }
  return true;
}

void PagePool::retain(int32_t page) {
  FP4MOE_CHECK(page >= 0 && page < num_pages() && refs_[size_t(page)] > 0, "retain of free or bad page {}", page);
  if (++refs_[size_t(page)] == 2 && indexed_[size_t(page)]) {
    --indexed_sole_;
    if (on_sole_) on_sole_(page);
  }
}

void PagePool::release(int32_t page) {
  FP4MOE_CHECK(page >= 0 && page < num_pages() && refs_[size_t(page)] > 0, "release of free or bad page {}", page);
  const bool idx = indexed_[size_t(page)] != 0;
  FP4MOE_CHECK(!idx || refs_[size_t(page)] > 1, "page {} freed while the prefix cache indexes it", page);
  const int32_t left = --refs_[size_t(page)];
  if (idx && left == 1) {
    ++indexed_sole_;
    if (on_sole_) on_sole_(page);
  }
  if (left == 0) free_.push_back(page);
}

void PagePool::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) release(p);
}

void PagePool::set_indexed(int32_t page, bool indexed) {
  FP4MOE_CHECK(page >= 0 && page < num_pages() && refs_[size_t(page)] > 0, "indexing a free or bad page {}", page);
  FP4MOE_CHECK(bool(indexed_[size_t(page)]) != indexed, "page {} is {} indexed", page, indexed ? "already" : "not");
  indexed_[size_t(page)] = indexed ? 1 : 0;
  if (refs_[size_t(page)] == 1) indexed_sole_ += indexed ? 1 : -1;
}

bool PagePool::indexed(int32_t page) const {
  FP4MOE_CHECK(page >= 0 && page < num_pages(), "bad page {}", page);
  return indexed_[size_t(page)] != 0;
}

int32_t PagePool::ref_count(int32_t page) const {
  FP4MOE_CHECK(page >= 0 && page < num_pages(), "bad page {}", page);
  return refs_[size_t(page)];
}

}  // namespace fp4moe::engine
