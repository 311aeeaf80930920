// FlashInfer 0.7.2's DSA top-k (flashinfer/topk.cuh, TopKPageTableTransformDispatch: its
// "filtered" one-CTA-per-row kernel or its multi-CTA radix kernel, by its own heuristic), through
// a thin wrapper: the measured baseline beside our radix top-k (`bench attention`'s topk rows,
// indexer_test). Built with the sm_90a FlashInfer objects (FP4MOE_HAVE_FLASHINFER); its filtered
// kernel needs 128 KB of shared memory per CTA. Same selection as ours up to the order of the
// entries and the choice among keys equal to the k-th (FlashInfer's order is not ascending).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::indexer {

struct FlashInferTopKArgs {
  const float* scores = nullptr;  // [rows, score_stride]
  int64_t score_stride = 0;
  int64_t rows = 0;
  const int32_t* lengths = nullptr;      // device [rows]: keys of each row (positions 0 .. length - 1)
  const int32_t* page_starts = nullptr;  // device [rows]: the row's first entry in page_indices
  const int32_t* page_indices = nullptr;
  int page_size = 64;  // power of two
  int max_ctx = 0;     // >= every length
  int top_k = 2048;    // <= 2048
  int32_t* out_slot = nullptr;  // [rows, top_k] cache slots, -1 padded
  int32_t* out_pos = nullptr;   // [rows, top_k] positions (same order), -1 padded; may be null
  void* workspace = nullptr;    // flashinfer_top_k_workspace_bytes(), zeroed once (the kernels leave it so)
  size_t workspace_bytes = 0;
};

size_t flashinfer_top_k_workspace_bytes();
// Empty when it can run here, else why not.
std::string flashinfer_top_k_can_implement(const FlashInferTopKArgs& a);
void flashinfer_top_k(const FlashInferTopKArgs& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::indexer
