#include "model/kv_pool.hpp"

#include <algorithm>
#include <new>

#include "core/error.hpp"

namespace fp4moe::model {

HostKvPool::HostKvPool(const PagedKvGeometry& g, const std::vector<bool>& has_index, float fp8_scale) : g_(g) {
  FP4MOE_CHECK(g.page_size >= 1 && g.num_pages >= 1 && g.num_layers >= 1 && int64_t(has_index.size()) == g.num_layers,
               "KV pool: {} layers, {} pages of {} tokens", g.num_layers, g.num_pages, g.page_size);
  auto take = [&](size_t bytes) {
    std::unique_ptr<uint8_t[]> p(new (std::nothrow) uint8_t[bytes]);
    FP4MOE_CHECK(p != nullptr, "out of memory: KV pool array of {} bytes", bytes);
    std::fill(p.get(), p.get() + bytes, uint8_t(0));
    bytes_ += bytes;
    storage_.push_back(std::move(p));
    return storage_.back().get();
  };
  for (int64_t l = 0; l < g.num_layers; ++l) {
    KvLayerView v;
    v.num_pages = g.num_pages;
    v.page_size = g.page_size;
    v.ckv_dim = g.ckv_dim;
    v.kpe_dim = g.kpe_dim;
    v.elem = g.elem;
    v.index_elem = g.index_elem;
    v.ckv_scale = v.kpe_scale = v.index_scale = fp8_scale;
    v.ckv = take(g.ckv_bytes());
    v.kpe = take(std::max<size_t>(g.kpe_bytes(), 1));
    if (has_index[size_t(l)]) {
      FP4MOE_CHECK(g.index_dim > 0, "KV pool: layer {} has an indexer but index_dim is 0", l);
      v.index_dim = g.index_dim;
      v.index_k = take(g.index_bytes());
    }
    layers_.push_back(v);
  }
  free_.resize(size_t(g.num_pages));
  for (int64_t p = 0; p < g.num_pages; ++p) free_[size_t(p)] = int32_t(g.num_pages - 1 - p);  // pop_back gives 0, 1, ...
}

std::vector<int32_t> HostKvPool::alloc(int64_t n) {
  FP4MOE_CHECK(n >= 0 && n <= free_pages(), "KV pool: {} pages wanted, {} free", n, free_pages());
  std::vector<int32_t> out(free_.end() - n, free_.end());
  std::reverse(out.begin(), out.end());
  free_.resize(free_.size() - size_t(n));
  return out;
}

void HostKvPool::release(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    FP4MOE_CHECK(p >= 0 && p < g_.num_pages, "KV pool: page {} released is not in the pool", p);
    free_.push_back(p);
  }
}

}  // namespace fp4moe::model
