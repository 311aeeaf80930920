// MlaSm90: validation, the planner object and the dispatch to the FlashInfer instantiations.
#include "cuda/attention/mla.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/attention/mla_fi_schedule_launch.hpp"

#if defined(FP4MOE_HAVE_FLASHINFER)
#include "cuda/attention/sm90_mla_flashinfer.hpp"
#endif

namespace fp4moe::cuda::attention {
namespace {

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }


}  // namespace

int current_device_sm() { return cuda::current_device().cc; }

std::string mla_can_implement(const MlaDesc& d, int sm) {
  if (!power_of_two(d.num_heads) || d.num_heads > 128)
    return fmt::format("MLA attention: {} heads unsupported (the SM90 MLA kernel needs a power of two <= 128)",
                       d.num_heads);
  if (d.kv_elem != KvElem::BF16 && d.kv_elem != KvElem::FP8_E4M3)
    return fmt::format("MLA attention: KV element {} unsupported (bf16 or fp8_e4m3)", kv_elem_name(d.kv_elem));
  if (!(d.sm_scale > 0)) return fmt::format("MLA attention: sm_scale {} must be positive", d.sm_scale);
#if !defined(FP4MOE_HAVE_FLASHINFER)
  return "MLA attention: built without FlashInfer (configure with its headers, see setup.sh)";
#else
  if (sm != 90) return fmt::format("MLA attention: the SM90 MLA kernel needs sm_90, this GPU is sm_{}", sm);
  return "";
#endif
}

size_t MlaSm90::float_workspace_bytes(int num_sm) {
  // MLAPlan: partial O (BF16) and partial LSE for 2 x clusters x cluster_tile_q rows, where
  // clusters x cluster_tile_q = num_sm x 64 for both cluster sizes; plus alignment slack.
  const size_t rows = partial_rows(num_sm);
  return rows * kCkvDim * 2 + rows * 4 + 256;
}

MlaSm90::MlaSm90(const MlaDesc& desc) : desc_(desc) {
  const int sm = current_device_sm();
  num_sm_ = cuda::current_device().sm_count;
  const std::string why = mla_can_implement(desc, sm);
  FP4MOE_CHECK(why.empty(), "{}", why);
  float_bytes_ = float_workspace_bytes(num_sm_);
  FP4MOE_CUDA_CHECK(cudaMalloc(&float_ws_, float_bytes_));
  FP4MOE_CUDA_CHECK(cudaMalloc(&int_ws_, kIntWorkspaceBytes));
  FP4MOE_CUDA_CHECK(cudaMallocHost(&pinned_, kIntWorkspaceBytes));
  FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
}

MlaSm90::~MlaSm90() {
  if (copied_) cudaEventSynchronize(copied_), cudaEventDestroy(copied_);
  cudaFreeHost(pinned_);
  cudaFree(int_ws_);
  cudaFree(float_ws_);
  cudaFree(dev_int_ws_);
  cudaFree(dev_float_ws_);
}

void check_prefill_batch(const KvBatchView& b, int64_t page_size, int64_t num_pages) {
  validate_kv_batch(b, page_size, num_pages);
  FP4MOE_CHECK(b.num_requests >= 1, "MLA plan: empty batch");
  for (int64_t r = 0; r < b.num_requests; ++r) {
    const int32_t q = b.qo_indptr[r + 1] - b.qo_indptr[r];
    for (int32_t j = 0; j < q; ++j)
      FP4MOE_CHECK(b.positions[b.qo_indptr[r] + j] == b.kv_len[r] - q + j,
                   "MLA plan: request {} token {} is at position {}; the SM90 MLA kernels need the {} new tokens "
                   "at the end of the context of {} (position {})",
                   r, j, b.positions[b.qo_indptr[r] + j], q, b.kv_len[r], b.kv_len[r] - q + j);
  }
}

void MlaSm90::plan(const KvBatchView& b, int64_t page_size, int64_t num_pages, cudaStream_t stream) {
  check_prefill_batch(b, page_size, num_pages);
  const size_t R = size_t(b.num_requests);
  plan_impl(std::vector<int32_t>(b.qo_indptr, b.qo_indptr + R + 1),
            std::vector<int32_t>(b.page_indptr, b.page_indptr + R + 1), std::vector<int32_t>(b.kv_len, b.kv_len + R),
            stream);
  sparse_ = false;
  page_size_ = int(page_size);
}

void MlaSm90::plan_sparse(const KvBatchView& b, int top_k, cudaStream_t stream) {
  FP4MOE_CHECK(b.num_tokens >= 1 && top_k >= 1, "MLA sparse plan: tokens {} and top_k {} must be >= 1",
               b.num_tokens, top_k);
  FP4MOE_CHECK(b.positions, "MLA sparse plan: positions are null");
  const size_t T = size_t(b.num_tokens);
  std::vector<int32_t> q_indptr(T + 1), kv_indptr(T + 1), kv_len(T);
  for (size_t t = 0; t < T; ++t) {
    FP4MOE_CHECK(b.positions[t] >= 0, "MLA sparse plan: token {} at position {}", t, b.positions[t]);
    kv_len[t] = std::min<int32_t>(top_k, b.positions[t] + 1);
    q_indptr[t + 1] = int32_t(t + 1);
    kv_indptr[t + 1] = int32_t(t + 1) * top_k;
  }
  plan_impl(q_indptr, kv_indptr, kv_len, stream);
  sparse_ = true;
  top_k_ = top_k;
}

void MlaSm90::plan_impl(const std::vector<int32_t>& q_indptr, const std::vector<int32_t>& kv_indptr,
                        const std::vector<int32_t>& kv_len, cudaStream_t stream) {
#if defined(FP4MOE_HAVE_FLASHINFER)
  // FlashInfer's schedule has room for kMaxWorks items and does not check: bound them first.
  // Each split of a tile adds at most one item per cluster (the split limit is >= total / clusters).
  const int batch = int(kv_len.size());
  int64_t tokens = 0;
  for (int r = 0; r < batch; ++r) tokens += q_indptr[size_t(r) + 1] - q_indptr[size_t(r)];
  const int64_t avg_packed = tokens * desc_.num_heads / batch;
  const int cluster_tile = avg_packed > 64 ? 128 : 64;
  int64_t tiles = 0;
  for (int r = 0; r < batch; ++r)
    tiles += (int64_t(q_indptr[size_t(r) + 1] - q_indptr[size_t(r)]) * desc_.num_heads + cluster_tile - 1) /
             cluster_tile;
  FP4MOE_CHECK(tiles + num_sm_ <= kMaxWorks,
               "MLA plan: {} query tokens x {} heads make {} tiles; the SM90 MLA schedule holds {} work items "
               "(split the queries into chunks)",
               tokens, desc_.num_heads, tiles, kMaxWorks - num_sm_);
  // The pinned staging buffer may still be read by the previous plan's copy.
  FP4MOE_CUDA_CHECK(cudaEventSynchronize(copied_));
  std::vector<int32_t> qi = q_indptr, ki = kv_indptr, kl = kv_len;
  const flashinfer_glue::Plan p = flashinfer_glue::plan(float_ws_, float_bytes_, int_ws_, pinned_,
                                                        kIntWorkspaceBytes, qi, ki, kl, desc_.num_heads, stream);
  FP4MOE_CHECK(p.works <= kMaxWorks, "MLA plan: {} work items (max {})", p.works, kMaxWorks);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(int_ws_, pinned_, p.staged_int_bytes, cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaEventRecord(copied_, stream));
  plan_info_ = p.info;
  works_ = p.works;
  tokens_ = int(tokens);
  planned_ = true;
#else
  (void)q_indptr, (void)kv_indptr, (void)kv_len, (void)stream;
  FP4MOE_FAIL("MLA attention: built without FlashInfer");
#endif
}

void MlaSm90::check_run_args(const MlaRunArgs& a, const char* who) const {
  const KvLayerView& L = a.layer;
  FP4MOE_CHECK(L.elem == desc_.kv_elem, "MLA {}: cache is {}, planned for {}", who, kv_elem_name(L.elem),
               kv_elem_name(desc_.kv_elem));
  FP4MOE_CHECK(L.ckv_dim == kCkvDim && L.kpe_dim == kKpeDim, "MLA {}: ckv/kpe dims {}/{} (the kernel is built for {}/{})",
               who, L.ckv_dim, L.kpe_dim, kCkvDim, kKpeDim);
  FP4MOE_CHECK(a.q_nope && a.q_pe && L.ckv && L.kpe && a.kv_indices && a.out, "MLA {}: a required pointer is null", who);
}

void MlaSm90::run(const MlaRunArgs& a, cudaStream_t stream) const {
  FP4MOE_CHECK(planned_, "MLA run: plan() first");
  check_run_args(a, "run");
  const KvLayerView& L = a.layer;
  FP4MOE_CHECK(sparse_ || L.page_size == page_size_, "MLA run: page_size {} (planned {})", L.page_size, page_size_);
  launch(plan_info_, float_ws_, int_ws_, sparse_ ? 1 : int(L.page_size), a, stream);
}

void MlaSm90::launch(const std::vector<int64_t>& info, void* float_ws, void* int_ws, int page_size, const MlaRunArgs& a,
                     cudaStream_t stream) const {
#if defined(FP4MOE_HAVE_FLASHINFER)
  flashinfer_glue::Launch l{&info, float_ws, int_ws, desc_.num_heads, desc_.sm_scale, page_size};
  const cudaError_t st = desc_.kv_elem == KvElem::BF16 ? flashinfer_glue::run_bf16(l, a, stream)
                                                       : flashinfer_glue::run_fp8(l, a, stream);
  FP4MOE_CUDA_CHECK(st);
  FP4MOE_CUDA_CHECK_LAUNCH();
#else
  (void)info, (void)float_ws, (void)int_ws, (void)page_size, (void)a, (void)stream;
#endif
}

// ---- device-scheduled decode (graph-capturable) ----
// The schedule's arrays live at fixed offsets of dev_int_ws_ (fi_sched::layout for
// max(dev_rows_, 2 x SMs) items), the partials in dev_float_ws_ laid out as MLAPlan's (2 x SMs
// x 64 BF16 rows of 512, then their LSE): every split run has rows x splits <= 2 x SMs.

int MlaSm90::device_splits(int rows, int max_keys) const { return fi_sched::splits_for(rows, max_keys, num_sm_); }

void MlaSm90::reserve_device(int max_rows) {
  FP4MOE_CHECK(max_rows >= 1, "MLA reserve_device: {} rows", max_rows);
  FP4MOE_CHECK(desc_.num_heads == fi_sched::kRowsPerToken,
               "MLA run_device: {} heads (its schedule packs {} heads, one 64-row tile, per query token)",
               desc_.num_heads, fi_sched::kRowsPerToken);
  if (max_rows <= dev_rows_) return;
  const fi_sched::Layout l = fi_sched::layout(std::max(max_rows, 2 * num_sm_), num_sm_);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // earlier device runs may still read the old buffers
  cudaFree(dev_int_ws_), cudaFree(dev_float_ws_);
  dev_int_ws_ = dev_float_ws_ = nullptr;
  dev_rows_ = 0;
  FP4MOE_CUDA_CHECK(cudaMalloc(&dev_int_ws_, size_t(l.bytes)));
  FP4MOE_CUDA_CHECK(cudaMalloc(&dev_float_ws_, float_bytes_));
  dev_info_ = {1,           num_sm_,         l.q_indptr,    l.kv_indptr,    l.partial_indptr, l.merge_start,
               l.merge_end, l.merge_p_start, l.merge_p_end, l.merge_stride, l.q_len,          l.kv_len,
               l.q_start,   l.kv_start,      l.kv_end,      l.work_indptr,  0,                int64_t(partial_rows(num_sm_)) * kCkvDim * 2};
  dev_layout_ = l;
  dev_rows_ = max_rows;
}

void MlaSm90::run_device(const MlaRunArgs& a, const MlaDeviceRows& rows, cudaStream_t stream) const {
  FP4MOE_CHECK(rows.tokens >= 1 && rows.tokens <= dev_rows_, "MLA run_device: {} rows (reserve_device reserved {})",
               rows.tokens, dev_rows_);
  FP4MOE_CHECK(rows.splits >= 0 && int64_t(rows.tokens) * rows.splits <= 2 * num_sm_,
               "MLA run_device: {} splits x {} rows (at most {} partial tiles)", rows.splits, rows.tokens, 2 * num_sm_);
  const bool sparse = rows.top_k > 0;
  FP4MOE_CHECK(sparse ? rows.positions != nullptr : (rows.kv_len && rows.page_indptr),
               "MLA run_device: the rows' device arrays are null");
  FP4MOE_CHECK(sparse || (rows.page_size >= 1 && rows.page_size == a.layer.page_size),
               "MLA run_device: page_size {} (the layer's {})", rows.page_size, a.layer.page_size);
  check_run_args(a, "run_device");
  fi_sched::Params p;
  p.kv_len = rows.kv_len;
  p.page_indptr = rows.page_indptr;
  p.positions = rows.positions;
  p.top_k = sparse ? rows.top_k : 0;
  p.rows = rows.tokens;
  p.splits = rows.splits > 0 ? rows.splits
                             : device_splits(rows.tokens, sparse ? std::min(rows.max_keys, rows.top_k) : rows.max_keys);
  p.ctas = num_sm_;
  p.ws = static_cast<unsigned char*>(dev_int_ws_);
  p.l = dev_layout_;
  FP4MOE_CHECK(p.splits == 1 || p.rows * p.splits <= 2 * num_sm_, "MLA run_device: split grid");
  FP4MOE_CUDA_CHECK(fi_sched::launch(p, stream, rows.pdl));
  launch(dev_info_, dev_float_ws_, dev_int_ws_, sparse ? 1 : int(rows.page_size), a, stream);
}

}  // namespace fp4moe::cuda::attention
