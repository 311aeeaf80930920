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
}

}  // namespace fp4moe::model
