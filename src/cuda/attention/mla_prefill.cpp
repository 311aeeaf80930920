// MlaPrefillExpandedSm90: plan (validation, FlashInfer's PrefillSM90Plan), run (gather the
// latents, expand K / V with two strided-batched cuBLAS GEMMs, FA3 ragged prefill).
#include "cuda/attention/mla_prefill.hpp"

#include <cublas_v2.h>

#include <algorithm>

#include "core/error.hpp"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/attention/mla.hpp"
#include "cuda/common/cuda_check.hpp"

#if defined(FP4MOE_HAVE_FLASHINFER)
#include "cuda/attention/sm90_mla_flashinfer.hpp"
#endif

namespace fp4moe::cuda::attention {
namespace {
constexpr int kHeadStride = 512;  // per head in the expanded buffer: [k_nope 192 | kpe 64 | v 256]
static_assert(kQkNopeDim + kKpeDim + kVDim == kHeadStride, "");
}  // namespace

MlaPrefillExpandedSm90::MlaPrefillExpandedSm90(int num_heads, float sm_scale, int64_t max_kv_tokens)
    : num_heads_(num_heads), sm_scale_(sm_scale), max_kv_(max_kv_tokens) {
  const std::string why = mla_can_implement({num_heads, sm_scale, KvElem::BF16}, current_device_sm());
  FP4MOE_CHECK(why.empty(), "{}", why);
  FP4MOE_CHECK(max_kv_tokens >= 1, "MLA prefill: max_kv_tokens {} must be >= 1", max_kv_tokens);
  FP4MOE_CUDA_CHECK(cudaMalloc(&ckv_, size_t(max_kv_) * kCkvDim * 2));
  FP4MOE_CUDA_CHECK(cudaMalloc(&kv_, size_t(max_kv_) * size_t(num_heads_) * kHeadStride * 2));
  FP4MOE_CUDA_CHECK(cudaMalloc(&int_ws_, kIntWorkspaceBytes));
  FP4MOE_CUDA_CHECK(cudaMallocHost(&pinned_, kIntWorkspaceBytes));
  FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  cublasHandle_t h = nullptr;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
  cublas_ = h;
}

MlaPrefillExpandedSm90::~MlaPrefillExpandedSm90() {
  if (copied_) cudaEventSynchronize(copied_), cudaEventDestroy(copied_);
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  cudaFreeHost(pinned_);
  cudaFree(int_ws_);
  cudaFree(kv_indptr_);
  cudaFree(kv_);
  cudaFree(ckv_);
}

void MlaPrefillExpandedSm90::plan(const KvBatchView& b, int64_t page_size, int64_t num_pages, cudaStream_t stream) {
  check_prefill_batch(b, page_size, num_pages);
  const size_t R = size_t(b.num_requests);
  std::vector<int32_t> qo(b.qo_indptr, b.qo_indptr + R + 1), kv_len(b.kv_len, b.kv_len + R), kv_indptr(R + 1, 0);
  for (size_t r = 0; r < R; ++r) kv_indptr[r + 1] = kv_indptr[r] + kv_len[r];
  FP4MOE_CHECK(kv_indptr[R] <= max_kv_, "MLA prefill: {} context tokens to expand, built for at most {}",
               kv_indptr[R], max_kv_);
#if defined(FP4MOE_HAVE_FLASHINFER)
  FP4MOE_CUDA_CHECK(cudaEventSynchronize(copied_));  // the pinned buffers may still be in flight
  // Device CSR arrays for the gather: [kv_indptr (R + 1) | page_indptr (R + 1)], staged at the end
  // of the pinned buffer (the schedule uses its start).
  cudaFree(kv_indptr_);
  FP4MOE_CUDA_CHECK(cudaMalloc(&kv_indptr_, 2 * (R + 1) * sizeof(int32_t)));
  auto* stage = static_cast<int32_t*>(pinned_) + (kIntWorkspaceBytes / 4 - 2 * (R + 1));
  std::copy(kv_indptr.begin(), kv_indptr.end(), stage);
  std::copy(b.page_indptr, b.page_indptr + R + 1, stage + R + 1);
  const flashinfer_glue::Plan p = flashinfer_glue::plan_prefill(
      nullptr, 0, int_ws_, pinned_, kIntWorkspaceBytes - 2 * (R + 1) * sizeof(int32_t) - 64, qo, kv_indptr, kv_len,
      num_heads_, stream);
  FP4MOE_CHECK(p.info.size() == 9 && p.info[8] == 0,
               "MLA prefill: {} query tokens need FlashInfer's all-heads schedule (not built); split the prefill",
               qo[R]);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(kv_indptr_, stage, 2 * (R + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaEventRecord(copied_, stream));
  plan_info_ = p.info;
  q_tokens_ = qo[R];
  kv_tokens_ = kv_indptr[R];
  requests_ = int64_t(R);
  page_size_ = page_size;
  planned_ = true;
#else
  (void)stream;
  FP4MOE_FAIL("MLA prefill: built without FlashInfer");
#endif
}

void MlaPrefillExpandedSm90::run(const MlaPrefillRunArgs& a, cudaStream_t stream) const {
  FP4MOE_CHECK(planned_, "MLA prefill run: plan() first");
  const KvLayerView& L = a.layer;
  FP4MOE_CHECK(a.q && a.kv_b_proj && L.ckv && L.kpe && a.page_indices && a.out,
               "MLA prefill run: a required pointer is null");
  FP4MOE_CHECK(L.ckv_dim == kCkvDim && L.kpe_dim == kKpeDim, "MLA prefill run: ckv/kpe dims {}/{} (built for 512/64)",
               L.ckv_dim, L.kpe_dim);
  FP4MOE_CHECK(L.page_size == page_size_, "MLA prefill run: page_size {} (planned {})", L.page_size, page_size_);
#if defined(FP4MOE_HAVE_FLASHINFER)
  const auto* kv_indptr = static_cast<const int32_t*>(kv_indptr_);
  mla_gather_latents(L, kv_indptr + requests_ + 1, a.page_indices, kv_indptr, requests_, kv_tokens_, num_heads_, ckv_,
                     kv_, stream);
  // k_nope_h [N, 192] and v_h [N, 256] = ckv [N, 512] · W_h^T, into their columns of each head
  // (column-major view: C_h^T = W_h · ckv^T, W_h row-major [rows, 512] = op T of a 512-ld matrix).
  auto h = static_cast<cublasHandle_t>(cublas_);
  FP4MOE_CUBLAS_CHECK(cublasSetStream(h, stream));
  const float one = 1.f, zero = 0.f;
  const int n = int(kv_tokens_), ldc = num_heads_ * kHeadStride;
  const long long w_stride = (kQkNopeDim + kVDim) * kCkvDim;
  const auto* w = static_cast<const uint16_t*>(a.kv_b_proj);
  auto* kv = static_cast<uint16_t*>(kv_);
  if (n > 0) {
    FP4MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kQkNopeDim, n, kCkvDim, &one, w,
                                                   CUDA_R_16BF, kCkvDim, w_stride, ckv_, CUDA_R_16BF, kCkvDim, 0, &zero,
                                                   kv, CUDA_R_16BF, ldc, kHeadStride, num_heads_, CUBLAS_COMPUTE_32F,
                                                   CUBLAS_GEMM_DEFAULT));
    FP4MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, kVDim, n, kCkvDim, &one, w + kQkNopeDim * kCkvDim, CUDA_R_16BF, kCkvDim, w_stride,
        ckv_, CUDA_R_16BF, kCkvDim, 0, &zero, kv + kQkNopeDim + kKpeDim, CUDA_R_16BF, ldc, kHeadStride, num_heads_,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  flashinfer_glue::PrefillLaunch l;
  l.info = &plan_info_;
  l.int_ws = int_ws_;
  l.q = a.q;
  l.k = kv;
  l.v = kv + kQkNopeDim + kKpeDim;
  l.o = a.out;
  l.lse = a.lse;
  l.q_stride_n = int64_t(num_heads_) * kExpandedHeadDim;
  l.q_stride_h = kExpandedHeadDim;
  l.kv_stride_n = ldc;
  l.kv_stride_h = kHeadStride;
  l.o_stride_n = int64_t(num_heads_) * kVDim;
  l.o_stride_h = kVDim;
  l.nnz_qo = q_tokens_;
  l.nnz_kv = kv_tokens_;
  l.num_heads = num_heads_;
  l.sm_scale = sm_scale_;
  FP4MOE_CUDA_CHECK(flashinfer_glue::run_prefill_expanded_bf16(l, stream));
  FP4MOE_CUDA_CHECK_LAUNCH();
#else
  (void)stream;
#endif
}

}  // namespace fp4moe::cuda::attention
