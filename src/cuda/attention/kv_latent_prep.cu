// kv_latent_prep's launch (the kernel and its numerics: kv_latent_prep.cuh). Compiled for every
// arch in CMAKE_CUDA_ARCHITECTURES: plain CUDA, no shared memory.
#include "cuda/attention/kv_latent_prep.cuh"

#include <string>

#include "core/error.hpp"
#include "cuda/attention/kv_append.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::attention {

std::string kv_latent_prep_can_implement(int64_t ckv_dim, int64_t kpe_dim) {
  if (ckv_dim != latentprep::kCkv || kpe_dim != latentprep::kKpe)
    return "latent prep: latent " + std::to_string(ckv_dim) + " + rope " + std::to_string(kpe_dim) +
           " (the fused kernel takes 512 + 64)";
  return "";
}

void kv_latent_prep(const KvLatentPrepArgs& a, cudaStream_t stream) {
  const KvLayerView& L = a.layer;
  const KvBatchView& b = a.batch;
  const std::string why = kv_latent_prep_can_implement(L.ckv_dim, L.kpe_dim);
  FP4MOE_CHECK(why.empty(), "{}", why);
  FP4MOE_CHECK(a.kv && a.norm_w && a.inv_freq && L.ckv && L.kpe && b.qo_indptr && b.positions && b.page_indptr &&
                   b.page_indices,
               "{}", "latent prep: a required pointer is null");
  FP4MOE_CHECK(a.kv_stride >= latentprep::kCkv + latentprep::kKpe && a.kv_stride % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(a.kv) % 16 == 0,
               "latent prep: kv rows must be 16-byte aligned and hold 576 values (stride {})", a.kv_stride);
  FP4MOE_CHECK(L.elem == KvElem::BF16 || L.elem == KvElem::FP8_E4M3, "latent prep: the cache must be bf16 or fp8_e4m3, not {}",
               kv_elem_name(L.elem));
  FP4MOE_CHECK(log2_exact(L.page_size) >= 0 && L.ckv_scale > 0 && L.kpe_scale > 0, "{}",
               "latent prep: page_size must be a power of two and the scales positive");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens < (int64_t(1) << 31) && b.num_requests >= 1, "{}",
               "latent prep: bad token / request count");
  if (b.num_tokens == 0) return;
  latentprep::Params p{};
  p.kv = static_cast<const uint16_t*>(a.kv);
  p.kv_stride = a.kv_stride;
  p.norm_w = a.norm_w;
  p.eps = a.eps;
  p.interleaved = a.interleaved;
  p.inv_freq = a.inv_freq;
  p.attn_factor = a.attn_factor;
  p.ckv_out = L.ckv;
  p.kpe_out = L.kpe;
  p.fp8 = L.elem == KvElem::FP8_E4M3;
  p.ckv_scale = L.ckv_scale;
  p.kpe_scale = L.kpe_scale;
  p.slots = kv_token_slots(L, b);
  const unsigned blocks = unsigned((b.num_tokens + latentprep::kWarpsPerBlock - 1) / latentprep::kWarpsPerBlock);
  latentprep::kv_latent_prep_kernel<<<blocks, latentprep::kWarpsPerBlock * 32, 0, stream>>>(p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::attention
