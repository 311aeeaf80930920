// index_key_prep's launch (the kernel and its numerics: index_key_prep.cuh). Compiled for every
// arch in CMAKE_CUDA_ARCHITECTURES: plain CUDA, no shared memory.
#include "cuda/indexer/index_key_prep.cuh"

#include <string>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"

namespace fp4moe::cuda::indexer {

std::string index_key_prep_can_implement(int64_t dim, int rope_dim, bool interleaved) {
  if (dim != keyprep::kDim) return "index key prep: " + std::to_string(dim) + " dims (the fused kernel takes 128)";
  if (rope_dim < 0 || rope_dim > keyprep::kDim || rope_dim % 2 != 0)
    return "index key prep: rope_dim " + std::to_string(rope_dim) + " (even, <= 128)";
  if (!interleaved && rope_dim % (2 * keyprep::kPerLane) != 0)
    return "index key prep: halves RoPE over " + std::to_string(rope_dim) + " dims (a multiple of 8)";
  return "";
}

void index_key_prep(const IndexKeyPrepArgs& a, cudaStream_t stream) {
  const KvLayerView& L = a.layer;
  const KvBatchView& b = a.batch;
  const std::string why = index_key_prep_can_implement(L.index_dim, a.rope_dim, a.interleaved);
  FP4MOE_CHECK(why.empty(), "{}", why);
  FP4MOE_CHECK(a.k && a.ln_w && a.ln_b && (a.rope_dim == 0 || a.inv_freq) && L.index_k && b.qo_indptr &&
                   b.positions && b.page_indptr && b.page_indices,
               "{}", "index key prep: a required pointer is null");
  FP4MOE_CHECK(a.k_stride >= keyprep::kDim, "index key prep: k_stride {} is below 128", a.k_stride);
  FP4MOE_CHECK(L.index_elem == KvElem::BF16 || L.index_elem == KvElem::FP8_E4M3,
               "index key prep: index keys must be bf16 or fp8_e4m3, not {}", kv_elem_name(L.index_elem));
  FP4MOE_CHECK(attention::log2_exact(L.page_size) >= 0 && L.index_scale > 0, "{}",
               "index key prep: page_size must be a power of two and index_scale positive");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens < (int64_t(1) << 31) && b.num_requests >= 1, "{}",
               "index key prep: bad token / request count");
  if (b.num_tokens == 0) return;
  keyprep::Params p{};
  p.k = static_cast<const uint16_t*>(a.k);
  p.k_stride = a.k_stride;
  p.ln_w = a.ln_w;
  p.ln_b = a.ln_b;
  p.eps = a.eps;
  p.rope_dim = a.rope_dim;
  p.interleaved = a.interleaved;
  p.inv_freq = a.inv_freq;
  p.attn_factor = a.attn_factor;
  p.out = L.index_k;
  p.fp8 = L.index_elem == KvElem::FP8_E4M3;
  p.scale = L.index_scale;
  p.slots = attention::kv_token_slots(L, b);
  const unsigned blocks = unsigned((b.num_tokens + keyprep::kWarpsPerBlock - 1) / keyprep::kWarpsPerBlock);
  keyprep::index_key_prep_kernel<<<blocks, keyprep::kWarpsPerBlock * 32, 0, stream>>>(p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::indexer
