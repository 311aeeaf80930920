// kv_append: one warp per new token writes its ckv (16 values per lane), kpe (2 per lane) and
// indexer key (4 per lane) rows into the token's slot, converting to the cache element type.
// Compiled for every arch in CMAKE_CUDA_ARCHITECTURES.
#include "cuda/attention/kv_append.hpp"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>

#include "cuda/attention/kv_device.cuh"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/common/cuda_check.hpp"
#include "core/error.hpp"

namespace fp4moe::cuda::attention {
namespace {

struct AppendParams {
  const __nv_bfloat16* ckv;
  const __nv_bfloat16* kpe;
  const __nv_bfloat16* index_k;
  void* ckv_out;
  void* kpe_out;
  void* index_out;
  bool fp8, index_fp8;
  float ckv_scale, kpe_scale, index_scale;
  KvTokenSlots slots;
};

// Copies N consecutive values per lane: src[lane * N ..] -> dst row (BF16, or E4M3 of x / scale:
// a true division, as the CPU's kv_encode, so the codes match bit for bit).
template <int N>
__device__ __forceinline__ void write_row(const __nv_bfloat16* src, void* dst_base, int64_t slot, int dim, bool fp8,
                                          float scale, int lane) {
  const int64_t off = slot * dim + int64_t(lane) * N;
  if (fp8) {
    auto* d = static_cast<__nv_fp8_e4m3*>(dst_base) + off;
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = __nv_fp8_e4m3(__fdiv_rn(__bfloat162float(src[lane * N + i]), scale));
  } else {
    auto* d = static_cast<__nv_bfloat16*>(dst_base) + off;
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = src[lane * N + i];
  }
}

__global__ void kv_append_kernel(const AppendParams p) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.slots.tokens) return;
  const int lane = threadIdx.x & 31;
  const int64_t slot = token_slot(p.slots, t);
  if (slot < 0) return;  // never write outside the pool
  write_row<kCkvDim / 32>(p.ckv + int64_t(t) * kCkvDim, p.ckv_out, slot, kCkvDim, p.fp8, p.ckv_scale, lane);
  write_row<kKpeDim / 32>(p.kpe + int64_t(t) * kKpeDim, p.kpe_out, slot, kKpeDim, p.fp8, p.kpe_scale, lane);
  if (p.index_k)
    write_row<kIndexDim / 32>(p.index_k + int64_t(t) * kIndexDim, p.index_out, slot, kIndexDim, p.index_fp8,
                              p.index_scale, lane);
}

bool supported(KvElem e) { return e == KvElem::BF16 || e == KvElem::FP8_E4M3; }

}  // namespace

void kv_append(const KvAppendArgs& a, cudaStream_t stream) {
  const KvLayerView& L = a.layer;
  const KvBatchView& b = a.batch;
  FP4MOE_CHECK(a.ckv && a.kpe && L.ckv && L.kpe && b.qo_indptr && b.positions && b.page_indptr && b.page_indices, "{}",
          "kv_append: a required pointer is null");
  FP4MOE_CHECK(!a.index_k || L.index_k, "{}", "kv_append: index keys given but the layer has no index_k array");
  FP4MOE_CHECK(L.ckv_dim == kCkvDim && L.kpe_dim == kKpeDim && (!a.index_k || L.index_dim == kIndexDim), "{}",
          "kv_append: dims " + std::to_string(L.ckv_dim) + "/" + std::to_string(L.kpe_dim) + "/" +
              std::to_string(L.index_dim) + " unsupported (512/64/128)");
  FP4MOE_CHECK(supported(L.elem) && (!a.index_k || supported(L.index_elem)), "{}", "kv_append: elements must be bf16 or fp8_e4m3");
  FP4MOE_CHECK(log2_exact(L.page_size) >= 0, "{}", "kv_append: page_size " + std::to_string(L.page_size) + " must be a power of two");
  FP4MOE_CHECK(L.ckv_scale > 0 && L.kpe_scale > 0 && L.index_scale > 0, "{}", "kv_append: scales must be positive");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens < (int64_t(1) << 31) && b.num_requests >= 1, "{}",
          "kv_append: bad token / request count");
  if (b.num_tokens == 0) return;
  AppendParams p{};
  p.ckv = static_cast<const __nv_bfloat16*>(a.ckv);
  p.kpe = static_cast<const __nv_bfloat16*>(a.kpe);
  p.index_k = static_cast<const __nv_bfloat16*>(a.index_k);
  p.ckv_out = L.ckv;
  p.kpe_out = L.kpe;
  p.index_out = L.index_k;
  p.fp8 = L.elem == KvElem::FP8_E4M3;
  p.index_fp8 = L.index_elem == KvElem::FP8_E4M3;
  p.ckv_scale = L.ckv_scale;
  p.kpe_scale = L.kpe_scale;
  p.index_scale = L.index_scale;
  p.slots = kv_token_slots(L, b);
  constexpr int kBlock = 256;
  const int64_t threads = b.num_tokens * 32;
  kv_append_kernel<<<unsigned((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::attention
