#include "engine/radix_cache.hpp"

#include <tuple>

#include "core/error.hpp"

namespace fp4moe::engine {

struct RadixCache::Node {
  int32_t page = -1;  // -1 at the root
  Node* parent = nullptr;
  uint64_t last_use = 0;
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;  // keyed by the page's tokens
  const std::vector<int32_t>* key = nullptr;                       // this node's key in its parent
  bool in_lru = false;
  uint64_t lru_stamp = 0;  // last_use when it entered lru_
};

RadixCache::RadixCache(PagePool& pool, int32_t page_size)
    : pool_(pool), page_size_(page_size), root_(std::make_unique<Node>()) {
  FP4MOE_CHECK(page_size > 0, "page size must be positive (got {})", page_size);
  node_of_page_.assign(size_t(pool.num_pages()), nullptr);
  pool_.set_sole_listener([this](int32_t page) {
    if (Node* x = node_of_page_[size_t(page)]) refresh(x);
  });
}

RadixCache::~RadixCache() { pool_.set_sole_listener(nullptr); }

void RadixCache::refresh(Node* x) {
  const bool want = x != root_.get() && x->children.empty() && pool_.ref_count(x->page) == 1;
  if (x->in_lru && (!want || x->lru_stamp != x->last_use)) {
    lru_.erase({x->lru_stamp, x->page, x});
    x->in_lru = false;
  }
  if (want && !x->in_lru) {
    lru_.emplace(x->last_use, x->page, x);
    x->in_lru = true;
    x->lru_stamp = x->last_use;
  }
}

int32_t RadixCache::match(std::span<const int32_t> tokens, int32_t max_pages, std::vector<int32_t>& pages) {
  const int32_t limit = std::min<int64_t>(max_pages, int64_t(tokens.size()) / page_size_);
  Node* node = root_.get();
  std::vector<int32_t> key(static_cast<size_t>(page_size_));
  const uint64_t now = ++clock_;
  int32_t n = 0;
  for (; n < limit; ++n) {
    key.assign(tokens.begin() + int64_t(n) * page_size_, tokens.begin() + int64_t(n + 1) * page_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_use = now;
    pool_.retain(node->page);
    pages.push_back(node->page);
  }
  return n;
}

void RadixCache::insert(std::span<const int32_t> tokens, int32_t n_pages, std::vector<int32_t>& pages) {
  FP4MOE_CHECK(int64_t(n_pages) * page_size_ <= int64_t(tokens.size()) && n_pages <= int32_t(pages.size()),
               "radix insert of {} pages past {} tokens / {} pages", n_pages, tokens.size(), pages.size());
  Node* node = root_.get();
  const uint64_t now = ++clock_;
  for (int32_t i = 0; i < n_pages; ++i) {
    std::vector<int32_t> key(tokens.begin() + int64_t(i) * page_size_, tokens.begin() + int64_t(i + 1) * page_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->page = pages[size_t(i)];
      child->parent = node;
      pool_.retain(child->page);
      pool_.set_indexed(child->page, true);
      it = node->children.emplace(std::move(key), std::move(child)).first;
      it->second->key = &it->first;
      node_of_page_[size_t(it->second->page)] = it->second.get();
      ++num_nodes_;
      refresh(node);  // no longer a leaf
    } else if (it->second->page != pages[size_t(i)]) {
      pool_.retain(it->second->page);
      pool_.release(pages[size_t(i)]);
      pages[size_t(i)] = it->second->page;
    }
    node = it->second.get();
    node->last_use = now;
    refresh(node);
  }
}

int32_t RadixCache::evict(int32_t n) {
  int32_t freed = 0;
  while (freed < n && !lru_.empty()) {
    Node* x = std::get<2>(*lru_.begin());
    lru_.erase(lru_.begin());
    x->in_lru = false;
    Node* parent = x->parent;
    const int32_t page = x->page;
    node_of_page_[size_t(page)] = nullptr;
    pool_.set_indexed(page, false);
    pool_.release(page);
    parent->children.erase(parent->children.find(*x->key));  // destroys x
    --num_nodes_;
    ++freed;
    refresh(parent);  // a leaf now, perhaps evictable
  }
  return freed;
}

void RadixCache::for_each_page(const std::function<void(int32_t)>& fn) const {
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* x = stack.back();
    stack.pop_back();
    for (auto& [k, c] : x->children) stack.push_back(c.get());
    if (x != root_.get()) fn(x->page);
  }
}

int32_t RadixCache::num_evictable() const { return pool_.num_indexed_sole(); }

int32_t RadixCache::count_evictable_by_walk() const { return count_sole_by_walk(false); }

int32_t RadixCache::count_evictable_leaves_by_walk() const { return count_sole_by_walk(true); }

int32_t RadixCache::count_sole_by_walk(bool leaves_only) const {
  int32_t n = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* x = stack.back();
    stack.pop_back();
    for (auto& [k, c] : x->children) stack.push_back(c.get());
    if (x != root_.get() && (!leaves_only || x->children.empty()) && pool_.ref_count(x->page) == 1) ++n;
  }
  return n;
}

}  // namespace fp4moe::engine
