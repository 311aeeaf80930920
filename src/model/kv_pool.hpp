// The host KV cache memory of the CPU backend: per layer the ckv / kpe arrays and, in layers
// that run the indexer, the index_k array, in the layout of core/paged_kv.hpp. One page id
// addresses the same slots in every layer. Which pages are free is not kept here: the engine's
// page allocator (engine/page_pool.hpp) hands out the ids; a caller running the model alone
// (tests) picks its own.
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
  size_t bytes() const { return bytes_; }

 private:
  PagedKvGeometry g_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::vector<KvLayerView> layers_;
  size_t bytes_ = 0;
};

}  // namespace fp4moe::model
