// The host KV page pool of the CPU backend: per layer the ckv / kpe arrays and, in layers
// that run the indexer, the index_k array, in the layout of core/paged_kv.hpp; plus a free
// list of page ids. One page id addresses the same slots in every layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/paged_kv.hpp"

namespace fp4moe::model {

class HostKvPool {
 public:
  // has_index[l]: layer l stores indexer keys (geometry.index_dim must be > 0 if any).
  HostKvPool(const PagedKvGeometry& g, const std::vector<bool>& has_index, float fp8_scale = 1.0f);

  const PagedKvGeometry& geometry() const { return g_; }
  const KvLayerView& layer(int64_t l) const { return layers_[size_t(l)]; }
  int64_t free_pages() const { return int64_t(free_.size()); }
  size_t bytes() const { return bytes_; }

  // Takes n pages (throws when the pool has fewer left); returns them to the pool.
  std::vector<int32_t> alloc(int64_t n);
  void release(const std::vector<int32_t>& pages);

 private:
  PagedKvGeometry g_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::vector<KvLayerView> layers_;
  std::vector<int32_t> free_;
  size_t bytes_ = 0;
};

}  // namespace fp4moe::model
