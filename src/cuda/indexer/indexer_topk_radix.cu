// Top-k of each indexer row by radix select (the kernels and their design: topk_radix.cuh).
// Rows of <= 16K keys (TopKArgs::one_cta_keys: 32K where the shared memory allows) take one
// CTA and one launch; longer rows a second launch of CTAs that
// each take every G-th slice of TopKArgs::slice_keys keys (4K by default) of their row (G:
// about one wave of CTAs over the batch), with a workspace (top_k_workspace_bytes). Compiled for every arch in
// CMAKE_CUDA_ARCHITECTURES: plain CUDA, <= 81 KB of shared memory per CTA.
#include "cuda/indexer/topk_radix.cuh"

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"
#include "core/error.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/launch.cuh"

namespace fp4moe::cuda::indexer {
namespace {

// The shared-memory opt-in, once per device and kernel, to the device's limit (the launch's
// own size, which depends on max_ctx, is checked against it): no attribute call per launch.
template <typename Kernel>
void allow_smem(DeviceOnce& opt_in, Kernel k, size_t bytes) {
  const int64_t limit = current_device().smem_per_block_optin;
  FP4MOE_CHECK(int64_t(bytes) <= limit, "indexer top-k: {} bytes of shared memory, the device allows {}", bytes, limit);
  opt_in([&] { FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit))); });
}

}  // namespace

namespace {
int slice_or_default(int slice_keys) { return slice_keys > 0 ? slice_keys : topk::kSliceKeys; }

// TopKArgs::one_cta_keys, checked: kRowKeys (0 too) or kRowKeysLarge where a block may have its
// shared memory.
int one_cta_keys(const TopKArgs& a) {
  const int keys = a.one_cta_keys == 0 ? topk::kRowKeys : a.one_cta_keys;
  FP4MOE_CHECK(keys == topk::kRowKeys || keys == topk::kRowKeysLarge, "indexer top-k: one_cta_keys {}: {} or {}",
               a.one_cta_keys, topk::kRowKeys, topk::kRowKeysLarge);
  const size_t need = topk::select_smem_bytes(keys, keys);
  FP4MOE_CHECK(int64_t(need) <= current_device().smem_per_block_optin,
               "indexer top-k: one_cta_keys {} needs {} bytes of shared memory per block, this GPU allows {}", keys,
               need, current_device().smem_per_block_optin);
  return keys;
}
}  // namespace

size_t top_k_workspace_bytes(int64_t rows, int max_ctx) { return topk::workspace_layout(rows, max_ctx).total; }

int top_k_max_one_cta_keys() {
  return topk::max_one_cta_keys(current_device().smem_per_block_optin);
}

int top_k_slice_keys(int64_t rows, int max_ctx) {
  return topk::slice_keys_for(rows, max_ctx, 2 * int(current_device().sm_count));
}

void top_k(const TopKArgs& a, cudaStream_t stream) {
  const KvBatchView& b = a.batch;
  FP4MOE_CHECK(a.scores && a.out_pos && b.qo_indptr && b.positions, "{}", "indexer top-k: a required pointer is null");
  FP4MOE_CHECK(a.top_k >= 1 && a.top_k <= kMaxTopK, "{}",
          "indexer top-k: k = " + std::to_string(a.top_k) + " outside [1, " + std::to_string(kMaxTopK) + "]");
  FP4MOE_CHECK(a.max_ctx >= 1 && a.max_ctx <= kMaxTopKContext, "{}",
          "indexer top-k: max_ctx " + std::to_string(a.max_ctx) + " outside [1, " + std::to_string(kMaxTopKContext) + "]");
  FP4MOE_CHECK(a.score_stride >= a.max_ctx, "{}", "indexer top-k: score_stride " + std::to_string(a.score_stride) +
                                           " is below max_ctx " + std::to_string(a.max_ctx));
  FP4MOE_CHECK(!a.out_slot || (b.page_indptr && b.page_indices), "{}", "indexer top-k: slots need the page table");
  FP4MOE_CHECK(!a.out_slot || attention::log2_exact(a.page_size) >= 0, "{}",
          "indexer top-k: page_size " + std::to_string(a.page_size) + " must be a power of two");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens <= 65535 && b.num_requests >= 1, "{}",
          "indexer top-k: " + std::to_string(b.num_tokens) + " rows (at most 65535 per call) / " +
              std::to_string(b.num_requests) + " requests");
  const int slice = slice_or_default(a.slice_keys);
  FP4MOE_CHECK(topk::slice_keys_valid(slice), "indexer top-k: slice_keys {} is not a multiple of {} in [{}, {}]", slice,
               topk::kSliceKeys, topk::kSliceKeys, topk::kMaxSliceKeys);
  const int sample_lines = a.sample_lines == 0 ? topk::kSampleLines : a.sample_lines;
  FP4MOE_CHECK(topk::sample_lines_valid(sample_lines), "indexer top-k: sample_lines {} outside [32, {}]", a.sample_lines,
               topk::kSampleLines);
  const int row_keys = one_cta_keys(a);
  if (b.num_tokens == 0) return;
  const topk::Layout l = topk::workspace_layout(b.num_tokens, a.max_ctx, slice, row_keys);
  FP4MOE_CHECK(l.total == 0 || (a.workspace && a.workspace_bytes >= l.total), "{}",
          "indexer top-k: rows of up to " + std::to_string(a.max_ctx) + " keys need a workspace of " +
              std::to_string(l.total) + " bytes (top_k_workspace_bytes), zeroed once; got " +
              std::to_string(a.workspace ? a.workspace_bytes : 0));
  topk::Params p{};
  p.scores = a.scores;
  p.score_stride = a.score_stride;
  p.qo_indptr = b.qo_indptr;
  p.positions = b.positions;
  p.page_indptr = b.page_indptr;
  p.page_indices = b.page_indices;
  p.num_requests = int(b.num_requests);
  p.top_k = a.top_k;
  p.out_pos = a.out_pos;
  p.out_slot = a.out_slot;
  p.page_shift = a.out_slot ? attention::log2_exact(a.page_size) : 0;
  p.max_ctx = a.max_ctx;
  p.row_keys = row_keys;
  p.slice_keys = slice;
  p.sample_lines = sample_lines;
  p.cand_counts = a.candidate_counts;
  if (l.total != 0) topk::bind_workspace(p, a.workspace, l);
  const size_t smem0 = topk::select_smem_bytes(a.max_ctx, row_keys), smem1 = topk::gather_smem_bytes();
  static DeviceOnce select_opt_in, gather_opt_in;
  allow_smem(select_opt_in, topk::topk_select_or_sample_kernel, smem0);
  FP4MOE_CUDA_CHECK(launch_kernel(a.pdl, topk::topk_select_or_sample_kernel, dim3(1, unsigned(b.num_tokens)),
                                  dim3(topk::kThreads), smem0, stream, p));
  if (l.total == 0) return;
  allow_smem(gather_opt_in, topk::topk_gather_kernel, smem1);
  const int g = topk::gather_ctas_per_row(b.num_tokens, l.slices, 2 * int(current_device().sm_count));
  FP4MOE_CUDA_CHECK(launch_kernel(a.pdl, topk::topk_gather_kernel, dim3(unsigned(g), unsigned(b.num_tokens)),
                                  dim3(topk::kThreads), smem1, stream, p));
}

TopKSampleStats top_k_sample_stats(const TopKArgs& a, cudaStream_t stream) {
  TopKSampleStats st;
  const int64_t rows = a.batch.num_tokens;
  const int row_keys = one_cta_keys(a);
  if (a.max_ctx <= row_keys || rows <= 0 || !a.candidate_counts) return st;
  std::vector<int32_t> count(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(count.data(), a.candidate_counts, count.size() * 4, cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(pos.data(), a.batch.positions, pos.size() * 4, cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<int32_t> n;
  for (int64_t r = 0; r < rows; ++r) {
    if (std::min(pos[size_t(r)] + 1, a.max_ctx) <= row_keys) continue;
    const int32_t c = count[size_t(r)];
    ++st.long_rows;
    st.streamed += c < a.top_k || c > topk::kCandCap;
    n.push_back(c);
  }
  if (!n.empty()) {
    std::nth_element(n.begin(), n.begin() + n.size() / 2, n.end());
    st.median_candidates = n[n.size() / 2];
  }
  return st;
}

}  // namespace fp4moe::cuda::indexer
