// mla_gather_latents: one warp per context token; the latent row (512) goes to the contiguous
// GEMM input, the rope key (64) to columns 192..255 of each head of the expanded K/V buffer.
// Compiled for every arch in CMAKE_CUDA_ARCHITECTURES.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "cuda/attention/kv_device.cuh"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/attention/mla_prefill.hpp"
#include "cuda/common/cuda_check.hpp"
#include "core/error.hpp"

namespace fp4moe::cuda::attention {
namespace {

struct GatherParams {
  const void* ckv;
  const void* kpe;
  bool fp8;
  float ckv_scale, kpe_scale;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  const int32_t* kv_indptr;
  int requests;
  int kv_tokens;
  int page_shift;
  int num_heads;
  __nv_bfloat16* ckv_out;
  __nv_bfloat16* kv;
};

__device__ __forceinline__ float load_elem(const void* base, int64_t i, bool fp8, float scale) {
  if (fp8) return float(static_cast<const __nv_fp8_e4m3*>(base)[i]) * scale;
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

__global__ void gather_latents_kernel(const GatherParams p) {
  const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= p.kv_tokens) return;
  const int lane = threadIdx.x & 31;
  const int r = request_of(p.kv_indptr, p.requests, i);
  const int pos = i - p.kv_indptr[r];
  const int64_t slot = slot_of(p.page_indices + p.page_indptr[r], p.page_shift, pos);
#pragma unroll
  for (int c = lane; c < kCkvDim; c += 32)
    p.ckv_out[int64_t(i) * kCkvDim + c] = __float2bfloat16_rn(load_elem(p.ckv, slot * kCkvDim + c, p.fp8, p.ckv_scale));
  const __nv_bfloat16 k0 = __float2bfloat16_rn(load_elem(p.kpe, slot * kKpeDim + lane, p.fp8, p.kpe_scale));
  const __nv_bfloat16 k1 = __float2bfloat16_rn(load_elem(p.kpe, slot * kKpeDim + lane + 32, p.fp8, p.kpe_scale));
  __nv_bfloat16* row = p.kv + int64_t(i) * p.num_heads * 512 + kQkNopeDim;
  for (int h = 0; h < p.num_heads; ++h) {
    row[h * 512 + lane] = k0;
    row[h * 512 + lane + 32] = k1;
  }
}

}  // namespace

void mla_gather_latents(const KvLayerView& layer, const int32_t* page_indptr, const int32_t* page_indices,
                        const int32_t* kv_indptr, int64_t requests, int64_t kv_tokens, int num_heads,
                        void* ckv_out, void* kv, cudaStream_t stream) {
  FP4MOE_CHECK(layer.elem == KvElem::BF16 || layer.elem == KvElem::FP8_E4M3, "{}", "MLA gather: cache must be bf16 or fp8_e4m3");
  FP4MOE_CHECK(log2_exact(layer.page_size) >= 0, "{}", "MLA gather: page_size must be a power of two");
  if (kv_tokens <= 0) return;
  GatherParams p{layer.ckv,
                 layer.kpe,
                 layer.elem == KvElem::FP8_E4M3,
                 layer.ckv_scale,
                 layer.kpe_scale,
                 page_indptr,
                 page_indices,
                 kv_indptr,
                 int(requests),
                 int(kv_tokens),
                 log2_exact(layer.page_size),
                 num_heads,
                 static_cast<__nv_bfloat16*>(ckv_out),
                 static_cast<__nv_bfloat16*>(kv)};
  constexpr int kBlock = 256;
  gather_latents_kernel<<<unsigned((kv_tokens * 32 + kBlock - 1) / kBlock), kBlock, 0, stream>>>(p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::attention
