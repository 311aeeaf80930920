// `fp4moe bench attention`: MLA attention and the DSA indexer at GLM-5 dimensions (64 heads,
// latent 512 + rope 64, indexer 32 x 128, top-2048, page size 64), on one layer's paged cache
// with every request's pages scattered over the pool.
//   decode  batch x context: dense MLA (FlashInfer's SM90 kernel via MlaSm90, and our
//           MlaDecodeMma), and for context > top-k the sparse path: indexer scores -> top-k ->
//           sparse MLA over the selected slots (both kernels); each stage timed alone and the
//           three back to back (with the faster sparse MLA); both kernels also through
//           run_device (the schedule built on the device: the runner's graph-captured path, "-dev");
//   prefill one fresh request of N tokens (causal), in query chunks of <= 16K tokens, in the
//           absorbed form (MlaSm90) and the expanded form (kv_b_proj GEMMs + FA3 prefill);
//   fp8     how often the FP8 indexer changes the selected set against the FP32 one (random
//           and model-like keys / queries).
// Every time is cold-L2 (256 MiB memset or read before each run: --l2-flush, median). Floors:
// bytes / the copy bandwidth measured in the same run (decode), flops / the BF16 (or FP8)
// cuBLASLt peak (prefill). Beside them, floor kernels under the same timer: "floor-move" (one
// launch moving a dense decode's bytes, contiguous), "floor-gather" (the latents through the
// page table / the selected slots: the cache's scattered order) and "floor-chain<n>" (the sparse
// pipeline's stage bytes in three launches, then padded with empty ones to the pipeline graph's
// launch count).
// Table rows start with '|'; --json writes everything.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/paged_kv.hpp"

#if defined(FP4MOE_HAVE_CUDA)
#include "cuda/attention/kv_append.hpp"
#include "cuda/attention/mla.hpp"
#include "cuda/attention/mla_decode.hpp"
#include "cuda/attention/mla_prefill.hpp"
#include "cuda/attention/mla_prefill_form.hpp"
#include "cuda/bench/bench_util.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/topk_flashinfer.hpp"
#if defined(FP4MOE_HAVE_GPU_RUNNER)
#include "engine/gpu/gpu_kernels.hpp"
#endif
#endif

namespace fp4moe::cli {
namespace {

struct Options {
  std::vector<int> batches = {1, 16, 64, 256};
  std::vector<int> contexts = {1024, 8192, 32768, 131072};
  std::vector<int> prefill = {256, 512, 1024, 4096, 8192, 16384, 32768};
  std::vector<std::string> kv = {"bf16", "fp8"};
  int page_size = 64;
  int top_k = 2048;
  int iters = 10;
  bool sparse = true, do_prefill = true, fp8_agreement = true, key_writes = true;
  std::string json_path;
  std::string l2_flush = "write";
};

#if defined(FP4MOE_HAVE_CUDA)
using namespace fp4moe::cuda;
namespace at = fp4moe::cuda::attention;
namespace ix = fp4moe::cuda::indexer;

constexpr int kHeads = 64;
constexpr float kSmScale = 0.0625f;
constexpr int kPrefillChunk = 16384;

using DeviceMem = cuda::DeviceBuffer;
template <typename T>
std::unique_ptr<DeviceMem> upload(const std::vector<T>& h, cudaStream_t s) {
  auto d = std::make_unique<DeviceMem>(h.size() * sizeof(T));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d->ptr(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return d;
}

struct Row {
  Row(std::string kind_, std::string kv_, std::string path_, int batch_, int ctx_)
      : kind(std::move(kind_)), kv(std::move(kv_)), path(std::move(path_)), batch(batch_), ctx(ctx_) {}
  std::string kind, kv, path;
  int batch = 0, ctx = 0;
  double us = 0, bytes = 0, flops = 0, floor_us = 0;
  std::string note;
};

// A GLM-5 layer view over device arrays (dims 512 / 64 / 128).
KvLayerView glm5_layer(void* ckv, void* kpe, void* index_k, int64_t pages, int64_t page_size, KvElem elem,
                       KvElem index_elem, float scale, float index_scale) {
  KvLayerView L;
  L.ckv = ckv;
  L.kpe = kpe;
  L.index_k = index_k;
  L.num_pages = pages;
  L.page_size = page_size;
  L.ckv_dim = at::kCkvDim;
  L.kpe_dim = at::kKpeDim;
  L.index_dim = at::kIndexDim;
  L.elem = elem;
  L.index_elem = index_elem;
  L.ckv_scale = L.kpe_scale = scale;
  L.index_scale = index_scale;
  return L;
}

// One layer's cache (ckv, kpe, index_k) for `slots` token slots, random contents.
struct Pool {
  KvElem elem;
  int64_t page_size, num_pages;
  std::unique_ptr<DeviceMem> ckv, kpe, index_k;
  Pool(KvElem e, int64_t ps, int64_t pages, cudaStream_t s) : elem(e), page_size(ps), num_pages(pages) {
    const size_t slots = size_t(ps * pages), eb = kv_elem_size(e);
    ckv = std::make_unique<DeviceMem>(slots * at::kCkvDim * eb);
    kpe = std::make_unique<DeviceMem>(slots * at::kKpeDim * eb);
    index_k = std::make_unique<DeviceMem>(slots * at::kIndexDim * eb);
    if (e == KvElem::BF16) {
      bench::fill_random_bf16(ckv->ptr(), slots * at::kCkvDim, 21, 1.0f, s);
      bench::fill_random_bf16(kpe->ptr(), slots * at::kKpeDim, 22, 1.0f, s);
      bench::fill_random_bf16(index_k->ptr(), slots * at::kIndexDim, 23, 1.0f, s);
    } else {  // positive E4M3 codes, x in [2^-6, 15] (no NaN); value = code * scale
      for (auto [m, n, seed] : {std::tuple{ckv.get(), slots * at::kCkvDim, 24}, {kpe.get(), slots * at::kKpeDim, 25},
                                {index_k.get(), slots * at::kIndexDim, 26}})
        bench::fill_random_u8(m->ptr(), n, uint64_t(seed), 0x08, 0x57, s);
    }
  }
  KvLayerView view() const {
    const float scale = elem == KvElem::BF16 ? 1.0f : 1.0f / 16;
    return glm5_layer(ckv->ptr(), kpe->ptr(), index_k->ptr(), num_pages, page_size, elem, elem, scale, scale);
  }
};

// A decode batch of B requests of context L (one new token each), pages drawn from a shuffled pool.
struct HostBatch {
  std::vector<int32_t> qo_indptr, positions, kv_len, page_indptr, page_indices;
  KvBatchView view() const {
    return {int64_t(kv_len.size()), int64_t(positions.size()), qo_indptr.data(), positions.data(),
            kv_len.data(),          page_indptr.data(),       page_indices.data()};
  }
};
HostBatch make_batch(int B, int L, int q_len, const std::vector<int32_t>& perm, int64_t page_size) {
  HostBatch h;
  h.qo_indptr = {0};
  h.page_indptr = {0};
  const int64_t ppr = (L + page_size - 1) / page_size;
  for (int r = 0; r < B; ++r) {
    for (int j = 0; j < q_len; ++j) h.positions.push_back(L - q_len + j);
    h.qo_indptr.push_back(int32_t(h.positions.size()));
    h.kv_len.push_back(L);
    for (int64_t i = 0; i < ppr; ++i) h.page_indices.push_back(perm[size_t(r * ppr + i)]);
    h.page_indptr.push_back(int32_t(h.page_indices.size()));
  }
  return h;
}
struct DevBatch {
  std::unique_ptr<DeviceMem> qo, pos, kvl, pip, pidx;
  KvBatchView v;
  DevBatch(const HostBatch& h, cudaStream_t s)
      : qo(upload(h.qo_indptr, s)), pos(upload(h.positions, s)), kvl(upload(h.kv_len, s)),
        pip(upload(h.page_indptr, s)), pidx(upload(h.page_indices, s)) {
    v = {int64_t(h.kv_len.size()), int64_t(h.positions.size()), qo->as<int32_t>(), pos->as<int32_t>(),
         kvl->as<int32_t>(),       pip->as<int32_t>(),           pidx->as<int32_t>()};
  }
};

// The DSA selection of a decode batch with contexts <= L: indexer scores (the query quantized
// to FP8 first when the keys are FP8), then the top-k positions (and slots when `slot` is given).
struct Selection {
  ix::IndexerScoreArgs score;
  ix::TopKArgs topk;
  const void* q_bf16 = nullptr;
  const float* w = nullptr;
  int64_t rows = 0;
  void run_indexer(cudaStream_t s) const { run_indexer_as(score, s); }
  // The same (FP8: the query quantized first), with `a`: `score` with another split.
  void run_indexer_as(const ix::IndexerScoreArgs& a, cudaStream_t s) const {
    if (a.layer.index_elem == KvElem::FP8_E4M3)
      ix::quantize_q_fp8(q_bf16, w, const_cast<void*>(a.q), const_cast<float*>(a.w), rows, s);
    ix::index_scores(a, s);
  }
  void run_topk(cudaStream_t s) const { ix::top_k(topk, s); }
};
Selection make_selection(const void* q, const float* w, void* q8, float* w8, const KvLayerView& layer,
                         const KvBatchView& b, int L, float* scores, int k, int32_t* pos, int32_t* slot,
                         const DeviceMem& ws, size_t ws_bytes, int32_t* cand_counts = nullptr) {
  Selection sel;
  sel.q_bf16 = q;
  sel.w = w;
  sel.rows = b.num_tokens;
  const bool fp8 = layer.index_elem == KvElem::FP8_E4M3;
  sel.score.q = fp8 ? q8 : q;
  sel.score.w = fp8 ? w8 : w;
  sel.score.layer = layer;
  sel.score.batch = b;
  sel.score.max_ctx = L;
  sel.score.scores = scores;
  sel.score.score_stride = L;
  sel.topk.scores = scores;
  sel.topk.score_stride = L;
  sel.topk.batch = b;
  sel.topk.top_k = k;
  sel.topk.out_pos = pos;
  sel.topk.out_slot = slot;
  sel.topk.page_size = layer.page_size;
  sel.topk.max_ctx = L;
  sel.topk.workspace = ws.ptr();
  sel.topk.workspace_bytes = ws_bytes;
  sel.topk.candidate_counts = cand_counts;
  FP4MOE_CHECK(ws_bytes >= ix::top_k_workspace_bytes(b.num_tokens, L), "bench: top-k workspace too small");
  return sel;
}

class Bench {
 public:
  Bench(const Options& o, cudaStream_t s) : opt_(o), s_(s), timer_(s, bench::l2_flush_from(o.l2_flush)) { ceil_ = bench::measure_ceilings(s); }
  const bench::Ceilings& ceilings() const { return ceil_; }
  std::vector<Row> rows;

  double time_us(const std::function<void()>& fn) { return timer_.time(fn, opt_.iters).median_us; }

  // Runs one case or part; a refused one (an fp4moe::Error) is reported as a table row and the
  // run goes on, so one failure does not cost the rest (a sticky CUDA error still ends it all).
  void guard(const std::string& what, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      ++failures_;
      std::printf("| %s | failed: %s\n", what.c_str(), e.what());
      std::fflush(stdout);
      cudaGetLastError();  // clear a non-sticky launch error
    }
  }
  int failures() const { return failures_; }
  // enqueue() captured into a CUDA graph on the bench stream, then its replays timed; `launches`
  // counts its kernel and memset nodes.
  struct GraphTime {
    double us = 0;
    int launches = 0;
  };
  GraphTime graph_time(const std::function<void()>& enqueue) {
    cudaGraph_t graph = nullptr;
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {  // leave the stream out of capture mode for the cases after this one
      cudaStreamEndCapture(s_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    FP4MOE_CUDA_CHECK(cudaStreamEndCapture(s_, &graph));
    GraphTime t;
    size_t n = 0;
    FP4MOE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    FP4MOE_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      FP4MOE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      t.launches += type == cudaGraphNodeTypeKernel || type == cudaGraphNodeTypeMemset;
    }
    cudaGraphExec_t exec = nullptr;
    FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    t.us = time_us([&] { FP4MOE_CUDA_CHECK(cudaGraphLaunch(exec, s_)); });
    FP4MOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    FP4MOE_CUDA_CHECK(cudaGraphDestroy(graph));
    return t;
  }
  double graph_time_us(const std::function<void()>& enqueue) { return graph_time(enqueue).us; }
  double copy_floor_us(double bytes) const { return bytes / (ceil_.copy_gbps * 1e3); }

  // The sparse pipeline's bytes moved by the floor kernels as one graph (`graph` its row, timed
  // the same way): one launch per stage (the index keys in and the scores out; the scores in and
  // the selection out; the selected latents and the queries in and the output out), then the same
  // three with empty launches added up to the pipeline graph's count. The first is what any
  // three-launch pipeline needs at this size, the second what the pipeline's launch count costs
  // before its kernels do any work.
  void floor_chain_rows(const Row& graph, int launches, const Pool& pool, double key_bytes, void* scores,
                        const void* q_nope, const void* q_pe, void* out) {
    const size_t B = size_t(graph.batch), L = size_t(graph.ctx), k = size_t(opt_.top_k);
    const double eb = double(kv_elem_size(pool.elem));
    const size_t score_bytes = B * L * 4, out_bytes = B * kHeads * at::kCkvDim * 2;
    auto stages = [&] {
      bench::move_bytes({{pool.index_k->ptr(), size_t(key_bytes)}}, scores, score_bytes, s_);
      bench::move_bytes({{scores, score_bytes}}, out, B * k * 8, s_);
      bench::move_bytes({{pool.ckv->ptr(), size_t(double(B * k) * at::kCkvDim * eb)},
                         {pool.kpe->ptr(), size_t(double(B * k) * at::kKpeDim * eb)},
                         {q_nope, out_bytes},
                         {q_pe, B * kHeads * at::kKpeDim * 2}},
                        out, out_bytes, s_);
    };
    for (const int n : {3, launches}) {
      if (n != 3 && launches <= 3) break;
      Row r = graph;
      r.path = fmt::format("floor-chain{}", n);
      r.us = graph_time_us([&] {
        stages();
        for (int i = 3; i < n; ++i) bench::launch_empty(s_);
      });
      r.note = fmt::format("3 floor kernels{}, one graph ({:.0f} MB of scores out and back in); the pipeline "
                           "graph takes {:.2f}x its time",
                           n > 3 ? fmt::format(" + {} empty launches", n - 3) : "",
                           2.0 * double(score_bytes) / 1e6, graph.us / r.us);
      report(r);
    }
  }
  // The score kernel with the runner's query RoPE (interleaved, 64 dims, GLM-5's frequencies)
  // and BF16 head weights fused into it, beside the plain scores (`plain` its row): what the
  // fused prologue costs a CTA.
  void fused_query_row(const Selection& sel, const Row& plain) {
    std::vector<float> inv_freq(32);
    for (int i = 0; i < 32; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(10000.0, 2.0 * i / 64));
    DeviceMem freq(inv_freq.size() * 4), w16(size_t(plain.batch) * ix::kIndexHeads * 2);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(freq.ptr(), inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice, s_));
    bench::fill_random_bf16(w16.ptr(), size_t(plain.batch) * ix::kIndexHeads, 36, 0.3f, s_);
    ix::IndexerScoreArgs a = sel.score;
    a.w = nullptr;
    a.w_bf16 = w16.ptr();
    a.w_bf16_scale = 1.0f / std::sqrt(float(ix::kIndexHeads));
    a.q_rope_inv_freq = freq.as<float>();
    a.q_rope_dim = 64;
    Row r = plain;
    r.path = "ours-mma+fused-q";
    r.us = time_us([&] { ix::index_scores(a, s_); });
    r.note = fmt::format("{:.2f}x the plain scores' time (query RoPE + BF16 weights in the prologue)", r.us / plain.us);
    report(r);
  }

  // The score kernel split by the rule before 2026-12-05 (~4 waves of 2 CTAs per SM, so one
  // 128-key tile per CTA below ~1K tiles per token x batch) beside the default one-wave split
  // (`plain` its row, `tiles` its tiles per CTA); skipped where the two rules agree.
  void waves_split_row(const Selection& sel, const Row& plain, int tiles) {
    const int64_t key_tiles = (int64_t(sel.score.max_ctx) + 127) / 128;
    const int64_t want = int64_t(cuda::current_device().sm_count) * 8;
    const int old_tiles = int(std::clamp<int64_t>(key_tiles * plain.batch / want, 1, 16));
    if (old_tiles == tiles) return;
    ix::IndexerScoreArgs a = sel.score;
    a.tiles_per_cta = old_tiles;
    Row r = plain;
    r.path = "ours-mma-4waves";
    r.us = time_us([&] { sel.run_indexer_as(a, s_); });
    r.note = fmt::format("{} key tiles per CTA; {:.2f}x the one-wave split's time", old_tiles, r.us / plain.us);
    report(r);
  }

  // FlashInfer's DSA top-k on the same scores (the baseline of ours, `ours` its row): time, and in
  // how many rows it selects the same set as ours did last (as sets: its order differs).
  void flashinfer_topk_row(const Selection& sel, const KvBatchView& b, const Row& ours, int64_t page_size) {
#if defined(FP4MOE_HAVE_FLASHINFER)
    const int64_t B = b.num_tokens, k = sel.topk.top_k;
    ix::FlashInferTopKArgs fa;
    fa.scores = sel.topk.scores;
    fa.score_stride = sel.topk.score_stride;
    fa.rows = B;
    fa.lengths = b.kv_len;          // decode rows: one token per request, all its keys
    fa.page_starts = b.page_indptr;  // the first B entries
    fa.page_indices = b.page_indices;
    fa.page_size = int(page_size);
    fa.max_ctx = sel.topk.max_ctx;
    fa.top_k = int(k);
    if (const std::string why = ix::flashinfer_top_k_can_implement(fa); !why.empty()) {
      std::printf("| topk | %s | flashinfer-topk | skipped: %s\n", ours.kv.c_str(), why.c_str());
      return;
    }
    DeviceMem pos(size_t(B * k) * 4), slot(size_t(B * k) * 4), ws(ix::flashinfer_top_k_workspace_bytes());
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(ws.ptr(), 0, ix::flashinfer_top_k_workspace_bytes(), s_));
    fa.out_pos = pos.as<int32_t>();
    fa.out_slot = slot.as<int32_t>();
    fa.workspace = ws.ptr();
    fa.workspace_bytes = ix::flashinfer_top_k_workspace_bytes();
    Row rf = ours;
    rf.path = "flashinfer-topk";
    rf.us = time_us([&] { ix::flashinfer_top_k(fa, s_); });
    std::vector<int32_t> a(size_t(B * k)), f(size_t(B * k));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(a.data(), sel.topk.out_pos, a.size() * 4, cudaMemcpyDeviceToHost, s_));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(f.data(), pos.ptr(), f.size() * 4, cudaMemcpyDeviceToHost, s_));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s_));
    int same = 0;
    for (int64_t r = 0; r < B; ++r) {
      std::sort(f.begin() + r * k, f.begin() + (r + 1) * k);
      same += std::equal(a.begin() + r * k, a.begin() + (r + 1) * k, f.begin() + r * k);
    }
    rf.note = fmt::format("{:.2f}x ours-radix's time; the same set as ours in {}/{} rows", rf.us / ours.us, same, B);
    report(rf);
#else
    (void)sel, (void)b, (void)ours, (void)page_size;
#endif
  }

  // Rows longer than 16K keys: how many the last top-k call streamed (its sample missed).
  std::string sample_note(const ix::TopKArgs& a) {
    const ix::TopKSampleStats st = ix::top_k_sample_stats(a, s_);
    if (st.long_rows == 0) return "";
    return fmt::format("streamed {}/{} rows; median {} candidates", st.streamed, st.long_rows, st.median_candidates);
  }

  void decode(KvElem elem) {
    const int maxB = *std::max_element(opt_.batches.begin(), opt_.batches.end());
    const int maxL = *std::max_element(opt_.contexts.begin(), opt_.contexts.end());
    const int64_t ps = opt_.page_size, ppr = (maxL + ps - 1) / ps, pages = int64_t(maxB) * ppr + 1;
    Pool pool(elem, ps, pages, s_);
    std::vector<int32_t> perm(static_cast<size_t>(pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
    const std::string kv = std::string(kv_elem_name(elem));
    const double eb = double(kv_elem_size(elem));
    at::MlaSm90 dense({kHeads, kSmScale, elem}), sparse({kHeads, kSmScale, elem});
    // The runner's decode path: the schedule built on the device (run_device), for both kernels.
    at::MlaSm90 dense_dev({kHeads, kSmScale, elem});
    dense_dev.reserve_device(maxB);
    const at::MlaDesc desc{kHeads, kSmScale, elem};
    const std::string ours_why = at::mla_decode_can_implement(desc);
    std::unique_ptr<at::MlaDecodeMma> ours_dense, ours_sparse, ours_wg;
    if (ours_why.empty()) {
      ours_dense = std::make_unique<at::MlaDecodeMma>(desc);
      ours_sparse = std::make_unique<at::MlaDecodeMma>(desc);
      ours_dense->reserve_device(maxB);
    } else {
      std::printf("| decode | %s | ours-mma | skipped: %s\n", kv.c_str(), ours_why.c_str());
    }
    // The wgmma variant (BF16 cache, sm_90): beside ours-mma, dense and sparse, host-planned and run_device.
    if (const std::string why = at::mla_decode_can_implement(desc, at::DecodeMath::kWgmma); why.empty()) {
      ours_wg = std::make_unique<at::MlaDecodeMma>(desc, at::DecodeMath::kWgmma);
      ours_wg->reserve_device(maxB);
    } else if (elem == KvElem::BF16) {
      std::printf("| decode | %s | ours-wgmma | skipped: %s\n", kv.c_str(), why.c_str());
    }
    // Queries / outputs / indexer buffers for the largest batch.
    DeviceMem q_nope(size_t(maxB) * kHeads * at::kCkvDim * 2), q_pe(size_t(maxB) * kHeads * at::kKpeDim * 2),
        out(size_t(maxB) * kHeads * at::kCkvDim * 2), qi(size_t(maxB) * at::kIndexHeads * at::kIndexDim * 2),
        qi8(size_t(maxB) * at::kIndexHeads * at::kIndexDim), w(size_t(maxB) * at::kIndexHeads * 4),
        w8(size_t(maxB) * at::kIndexHeads * 4), scores(size_t(maxB) * size_t(maxL) * 4),
        sel_pos(size_t(maxB) * size_t(opt_.top_k) * 4), sel_slot(size_t(maxB) * size_t(opt_.top_k) * 4);
    const size_t topk_ws_bytes = ix::top_k_workspace_bytes(maxB, maxL);  // any slice_keys ("ours-radix-wide")
    DeviceMem topk_ws(topk_ws_bytes), topk_counts(size_t(maxB) * 4);
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(topk_ws.ptr(), 0, topk_ws_bytes, s_));  // once: the kernels leave it zeroed
    bench::fill_random_bf16(q_nope.ptr(), size_t(maxB) * kHeads * at::kCkvDim, 31, 0.5f, s_);
    bench::fill_random_bf16(q_pe.ptr(), size_t(maxB) * kHeads * at::kKpeDim, 32, 0.5f, s_);
    bench::fill_random_bf16(qi.ptr(), size_t(maxB) * at::kIndexHeads * at::kIndexDim, 33, 1.0f, s_);
    bench::fill_random_f32(w.as<float>(), size_t(maxB) * at::kIndexHeads, 34, -0.2f, 0.5f, s_);
    for (int B : opt_.batches)
      for (int L : opt_.contexts) guard(fmt::format("decode {} B {} ctx {}", kv, B, L), [&] {
        const HostBatch hb = make_batch(B, L, 1, perm, ps);
        DevBatch db(hb, s_);
        const KvLayerView layer = pool.view();
        dense.plan(hb.view(), ps, pages, s_);
        at::MlaRunArgs a{q_nope.ptr(), q_pe.ptr(), layer, db.v.page_indices, out.ptr(), nullptr};
        const double q_bytes = double(B) * kHeads * (at::kCkvDim + at::kKpeDim + at::kCkvDim) * 2;
        Row r{"decode", kv, "flashinfer-sm90", B, L};
        r.bytes = double(B) * L * (at::kCkvDim + at::kKpeDim) * eb + q_bytes;
        r.flops = 2.0 * B * kHeads * double(L) * (at::kCkvDim + at::kKpeDim + at::kCkvDim);
        r.us = time_us([&] { dense.run(a, s_); });
        r.floor_us = copy_floor_us(r.bytes);
        report(r);
        // The floor kernel at this size: one launch that reads the same latents and queries and
        // writes the output, under the same timer (what the copy bandwidth buys at these bytes).
        Row rm = r;
        rm.path = "floor-move";
        rm.flops = 0;
        const size_t q_nope_bytes = size_t(B) * kHeads * at::kCkvDim * 2;
        rm.us = time_us([&] {
          bench::move_bytes({{pool.ckv->ptr(), size_t(double(B) * L * at::kCkvDim * eb)},
                             {pool.kpe->ptr(), size_t(double(B) * L * at::kKpeDim * eb)},
                             {q_nope.ptr(), q_nope_bytes},
                             {q_pe.ptr(), size_t(B) * kHeads * at::kKpeDim * 2}},
                            out.ptr(), q_nope_bytes, s_);
        });
        rm.note = fmt::format("one launch moving the same bytes; flashinfer takes {:.2f}x its time", r.us / rm.us);
        report(rm);
        // The same latents read through the batch's page table (the cache's scattered pages).
        Row rp = rm;
        rp.path = "floor-gather";
        rp.bytes = double(B) * L * (at::kCkvDim + at::kKpeDim) * eb;
        rp.floor_us = copy_floor_us(rp.bytes);
        const int64_t n_pages = int64_t(B) * ((L + ps - 1) / ps);
        rp.us = time_us([&] {
          bench::gather_pages({{pool.ckv->ptr(), size_t(double(ps) * at::kCkvDim * eb)},
                               {pool.kpe->ptr(), size_t(double(ps) * at::kKpeDim * eb)}},
                              db.v.page_indices, n_pages, s_);
        });
        rp.note = fmt::format("the latents alone through the page table ({} pages of {}); {:.2f}x floor-move's time",
                              n_pages, ps, rp.us / rm.us);
        report(rp);
        if (ours_dense) {
          ours_dense->plan(hb.view(), ps, pages, s_);
          Row ro{"decode", kv, "ours-mma", B, L};
          ro.bytes = r.bytes;
          ro.flops = r.flops;
          ro.us = time_us([&] { ours_dense->run(a, s_); });
          ro.floor_us = r.floor_us;
          ro.note = fmt::format("{:.2f}x flashinfer's time ({} items, {} split)", ro.us / r.us,
                                ours_dense->planned_items(), ours_dense->planned_partials());
          report(ro);
        }
        // run_device: the schedule kernel + the attention kernel, as the runner's decode graphs run them.
        at::MlaDeviceRows rows;
        rows.tokens = B;
        rows.max_keys = L;
        rows.kv_len = db.v.kv_len;
        rows.page_indptr = db.v.page_indptr;
        rows.page_size = ps;
        // A run_device row beside `planned` (FlashInfer's host-planned row of the same stage).
        auto dev_row = [&](const Row& planned, const std::string& impl, const std::function<void()>& fn,
                           const std::string& note) {
          Row rd = planned;
          rd.path = impl;
          rd.us = time_us(fn);
          rd.note = fmt::format("{:.2f}x flashinfer's planned time{}", rd.us / planned.us, note);
          report(rd);
        };
        dev_row(r, "flashinfer-sm90-dev", [&] { dense_dev.run_device(a, rows, s_); },
                fmt::format("; {} splits per row", dense_dev.device_splits(B, L)));
        // Forced split counts beside the rule's (MlaDeviceRows::splits), where a batch cannot fill
        // the GPU by rows: fewer splits write fewer partial rows for the merge, more use more SMs.
        if (elem == KvElem::BF16 && B <= 16 && L >= 8192) {
          const int rule = dense_dev.device_splits(B, L), sms = int(cuda::current_device().sm_count);
          for (const int sp : {2, 4, 6, 8, 12, 16}) {
            if (sp == rule || B * sp > 2 * sms) continue;
            at::MlaDeviceRows forced = rows;
            forced.splits = sp;
            dev_row(r, fmt::format("flashinfer-sm90-dev-s{}", sp), [&] { dense_dev.run_device(a, forced, s_); },
                    fmt::format("; {} splits per row (forced; the rule's {})", sp, rule));
          }
        }
        if (ours_dense)
          dev_row(r, "ours-mma-dev", [&] { ours_dense->run_device(a, rows, s_); },
                  fmt::format("; {} splits per row", ours_dense->device_splits(B, L)));
        if (ours_wg) {
          ours_wg->plan(hb.view(), ps, pages, s_);
          Row rw{"decode", kv, "ours-wgmma", B, L};
          rw.bytes = r.bytes;
          rw.flops = r.flops;
          rw.us = time_us([&] { ours_wg->run(a, s_); });
          rw.floor_us = r.floor_us;
          rw.note = fmt::format("{:.2f}x flashinfer's time", rw.us / r.us);
          report(rw);
          dev_row(r, "ours-wgmma-dev", [&] { ours_wg->run_device(a, rows, s_); },
                  fmt::format("; {} splits per row", ours_wg->device_splits(B, L)));
        }
        if (!opt_.sparse || L <= opt_.top_k) return;

        // Sparse: indexer (+ FP8 query quantization) -> top-k -> sparse MLA.
        const Selection sel = make_selection(qi.ptr(), w.as<float>(), qi8.ptr(), w8.as<float>(), layer, db.v, L,
                                             scores.as<float>(), opt_.top_k, sel_pos.as<int32_t>(),
                                             sel_slot.as<int32_t>(), topk_ws, topk_ws_bytes,
                                             topk_counts.as<int32_t>());
        sparse.plan_sparse(hb.view(), opt_.top_k, s_);
        at::MlaRunArgs sp{q_nope.ptr(), q_pe.ptr(), layer, sel_slot.as<int32_t>(), out.ptr(), nullptr};
        const double key_bytes = double(B) * L * at::kIndexDim * eb;
        Row ri{"indexer", kv, "ours-mma", B, L};
        ri.bytes = key_bytes;
        ri.flops = 2.0 * B * double(L) * at::kIndexHeads * at::kIndexDim;
        ri.us = time_us([&] { sel.run_indexer(s_); });
        ri.floor_us = copy_floor_us(key_bytes);
        const int tiles = ix::index_score_tiles_per_cta(B, L, layer.index_elem);
        ri.note = fmt::format("+{:.0f} MB scores written; {} key tiles per CTA", double(B) * L * 4 / 1e6, tiles);
        report(ri);
        waves_split_row(sel, ri, tiles);
        if (elem == KvElem::BF16) fused_query_row(sel, ri);
        Row rt{"topk", kv, "ours-radix", B, L};
        rt.bytes = double(B) * L * 4;
        rt.us = time_us([&] { sel.run_topk(s_); });
        rt.floor_us = copy_floor_us(rt.bytes);
        rt.note = sample_note(sel.topk);
        report(rt);
        // Wider slices for many long rows (top_k_slice_keys), beside the default 4K; same selection.
        if (const int wide = ix::top_k_slice_keys(B, L); L > 16384 && wide != 4096) {
          ix::TopKArgs wide_args = sel.topk;
          wide_args.slice_keys = wide;
          Row rw{"topk", kv, "ours-radix-wide", B, L};
          rw.bytes = rt.bytes;
          rw.us = time_us([&] { ix::top_k(wide_args, s_); });
          rw.floor_us = rt.floor_us;
          rw.note = fmt::format("{} keys per CTA; {:.2f}x ours-radix's time; {}", wide, rw.us / rt.us,
                                sample_note(wide_args));
          report(rw);
        }
        // Smaller samples for the long rows' candidate threshold (TopKArgs::sample_lines); same selection.
        for (const int lines : {64, 128}) {
          if (L <= 16384) break;
          ix::TopKArgs small = sel.topk;
          small.sample_lines = lines;
          Row rl{"topk", kv, fmt::format("ours-radix-sample{}", lines), B, L};
          rl.bytes = rt.bytes;
          rl.us = time_us([&] { ix::top_k(small, s_); });
          rl.floor_us = rt.floor_us;
          rl.note = fmt::format("{:.2f}x ours-radix's time; {}", rl.us / rt.us, sample_note(small));
          report(rl);
        }
        // Rows of 16K-32K keys on the one-CTA path (TopKArgs::one_cta_keys 32768) beside the sampled one.
        if (L > 16384 && L <= 32768 && ix::top_k_max_one_cta_keys() >= 32768) {
          ix::TopKArgs one = sel.topk;
          one.one_cta_keys = 32768;
          Row r1{"topk", kv, "ours-radix-1cta32k", B, L};
          r1.bytes = rt.bytes;
          r1.us = time_us([&] { ix::top_k(one, s_); });
          r1.floor_us = rt.floor_us;
          r1.note = fmt::format("one CTA and one launch per row; {:.2f}x ours-radix's time", r1.us / rt.us);
          report(r1);
        }
        flashinfer_topk_row(sel, db.v, rt, ps);
        Row rs{"sparse-mla", kv, "flashinfer-sm90-ps1", B, L};
        rs.bytes = double(B) * opt_.top_k * (at::kCkvDim + at::kKpeDim) * eb + q_bytes;
        rs.flops = 2.0 * B * kHeads * double(opt_.top_k) * (at::kCkvDim + at::kKpeDim + at::kCkvDim);
        rs.us = time_us([&] { sparse.run(sp, s_); });
        rs.floor_us = copy_floor_us(rs.bytes);
        report(rs);
        {  // the selected latents alone, read through the slot list (one-token pages)
          Row rgp = rs;
          rgp.path = "floor-gather";
          rgp.bytes = double(B) * opt_.top_k * (at::kCkvDim + at::kKpeDim) * eb;
          rgp.flops = 0;
          rgp.floor_us = copy_floor_us(rgp.bytes);
          rgp.us = time_us([&] {
            bench::gather_pages({{pool.ckv->ptr(), size_t(at::kCkvDim * eb)}, {pool.kpe->ptr(), size_t(at::kKpeDim * eb)}},
                                sel_slot.as<int32_t>(), int64_t(B) * opt_.top_k, s_);
          });
          rgp.note = fmt::format("the selected latents alone through the slot list; flashinfer takes {:.2f}x its time",
                                 rs.us / rgp.us);
          report(rgp);
        }
        bool use_ours = false;
        if (ours_sparse) {
          ours_sparse->plan_sparse(hb.view(), opt_.top_k, s_);
          Row rso{"sparse-mla", kv, "ours-mma", B, L};
          rso.bytes = rs.bytes;
          rso.flops = rs.flops;
          rso.us = time_us([&] { ours_sparse->run(sp, s_); });
          rso.floor_us = rs.floor_us;
          rso.note = fmt::format("{:.2f}x flashinfer's time", rso.us / rs.us);
          report(rso);
          use_ours = rso.us < rs.us;
        }
        at::MlaDeviceRows srows;  // the runner's sparse rows: device-built schedules
        srows.tokens = B;
        srows.max_keys = std::min(L, opt_.top_k);
        srows.positions = db.v.positions;
        srows.top_k = opt_.top_k;
        dev_row(rs, "flashinfer-sm90-ps1-dev", [&] { dense_dev.run_device(sp, srows, s_); }, "");
        if (ours_dense) dev_row(rs, "ours-mma-dev", [&] { ours_dense->run_device(sp, srows, s_); }, "");
        if (ours_wg) {
          ours_wg->plan_sparse(hb.view(), opt_.top_k, s_);
          Row rw = rs;
          rw.path = "ours-wgmma";
          rw.us = time_us([&] { ours_wg->run(sp, s_); });
          rw.note = fmt::format("{:.2f}x flashinfer's time", rw.us / rs.us);
          report(rw);
          dev_row(rs, "ours-wgmma-dev", [&] { ours_wg->run_device(sp, srows, s_); }, "");
        }
        Row rall{"sparse-decode", kv, use_ours ? "indexer+topk+ours-mma" : "indexer+topk+flashinfer", B, L};
        rall.bytes = key_bytes + rs.bytes;
        rall.us = time_us([&] {
          sel.run_indexer(s_);
          sel.run_topk(s_);
          if (use_ours) ours_sparse->run(sp, s_);
          else sparse.run(sp, s_);
        });
        rall.floor_us = copy_floor_us(rall.bytes);
        rall.note = fmt::format("vs dense {:.2f}x", r.us / rall.us);
        report(rall);
        // The runner's form of the same step: the three stages in one CUDA graph (device-built MLA
        // schedule), so no launch gap between them; still cold L2 before each replay.
        Row rg = rall;
        rg.path = use_ours ? "graph:indexer+topk+ours-mma-dev" : "graph:indexer+topk+flashinfer-dev";
        const GraphTime gt = graph_time([&] {
          sel.run_indexer(s_);
          sel.run_topk(s_);
          if (use_ours) ours_dense->run_device(sp, srows, s_);
          else dense_dev.run_device(sp, srows, s_);
        });
        rg.us = gt.us;
        rg.note = fmt::format("{:.2f}x the stream-launched pipeline's time; {} launches", rg.us / rall.us, gt.launches);
        report(rg);
        // The same graph with programmatic dependent launch on our kernels (each kernel's blocks
        // launch while the one before finishes; FlashInfer's attention kernel launches plainly).
        Selection sel_pdl = sel;
        sel_pdl.score.pdl = sel_pdl.topk.pdl = true;
        at::MlaDeviceRows srows_pdl = srows;
        srows_pdl.pdl = true;
        Row rpd = rg;
        rpd.path = use_ours ? "graph+pdl:indexer+topk+ours-mma-dev" : "graph+pdl:indexer+topk+flashinfer-dev";
        rpd.us = graph_time_us([&] {
          sel_pdl.run_indexer(s_);
          sel_pdl.run_topk(s_);
          if (use_ours) ours_dense->run_device(sp, srows_pdl, s_);
          else dense_dev.run_device(sp, srows_pdl, s_);
        });
        rpd.note = fmt::format("{:.2f}x the plain graph's time", rpd.us / rg.us);
        report(rpd);
        floor_chain_rows(rg, gt.launches, pool, key_bytes, scores.ptr(), q_nope.ptr(), q_pe.ptr(), out.ptr());
      });
  }

  void prefill(KvElem elem) {
    const int maxN = *std::max_element(opt_.prefill.begin(), opt_.prefill.end());
    const int64_t ps = opt_.page_size, pages = (maxN + ps - 1) / ps + 1;
    Pool pool(elem, ps, pages, s_);
    std::vector<int32_t> perm(static_cast<size_t>(pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(8));
    DeviceMem q_nope(size_t(maxN) * kHeads * at::kCkvDim * 2), q_pe(size_t(maxN) * kHeads * at::kKpeDim * 2),
        out(size_t(maxN) * kHeads * at::kCkvDim * 2);
    bench::fill_random_bf16(q_nope.ptr(), size_t(maxN) * kHeads * at::kCkvDim, 41, 0.5f, s_);
    bench::fill_random_bf16(q_pe.ptr(), size_t(maxN) * kHeads * at::kKpeDim, 42, 0.5f, s_);
    // The expanded form's inputs: q [N, 64, 256], kv_b_proj [64 * 448, 512], out [N, 64, 256].
    const size_t wb = size_t(kHeads) * (at::kQkNopeDim + at::kVDim) * at::kCkvDim;
    DeviceMem q_exp(size_t(maxN) * kHeads * at::kExpandedHeadDim * 2), kv_b(wb * 2),
        out_exp(size_t(maxN) * kHeads * at::kVDim * 2);
    bench::fill_random_bf16(q_exp.ptr(), size_t(maxN) * kHeads * at::kExpandedHeadDim, 43, 0.5f, s_);
    bench::fill_random_bf16(kv_b.ptr(), wb, 44, 0.044f, s_);
    const std::string kv = std::string(kv_elem_name(elem));
    for (int N : opt_.prefill) guard(fmt::format("prefill {} N {}", kv, N), [&] {
      // Chunk c: queries [c0, c1) at the end of a context of c1 tokens (chunked prefill).
      std::vector<std::unique_ptr<at::MlaSm90>> plans;
      std::vector<std::unique_ptr<DevBatch>> batches;
      std::vector<at::MlaRunArgs> args;
      for (int c0 = 0; c0 < N; c0 += kPrefillChunk) {
        const int c1 = std::min(N, c0 + kPrefillChunk);
        HostBatch hb = make_batch(1, c1, c1 - c0, perm, ps);
        batches.push_back(std::make_unique<DevBatch>(hb, s_));
        plans.push_back(std::make_unique<at::MlaSm90>(at::MlaDesc{kHeads, kSmScale, elem}));
        plans.back()->plan(hb.view(), ps, pages, s_);
        const size_t qoff = size_t(c0) * kHeads;
        args.push_back({q_nope.as<uint16_t>() + qoff * at::kCkvDim, q_pe.as<uint16_t>() + qoff * at::kKpeDim,
                        pool.view(), batches.back()->v.page_indices, out.as<uint16_t>() + qoff * at::kCkvDim,
                        nullptr});
      }
      Row r{"prefill", kv, "flashinfer-sm90-absorbed", 1, N};
      const double pairs = double(N) * (N + 1) / 2;  // causal (query, key) pairs
      r.flops = 2.0 * kHeads * pairs * (at::kCkvDim + at::kKpeDim + at::kCkvDim);
      r.bytes = double(N) * (at::kCkvDim + at::kKpeDim) * double(kv_elem_size(elem)) +
                double(N) * kHeads * (at::kCkvDim * 2 + at::kKpeDim) * 2;
      r.us = time_us([&] {
        for (size_t i = 0; i < plans.size(); ++i) plans[i]->run(args[i], s_);
      });
      r.floor_us = r.flops / (ceil_.bf16_tflops * 1e6);  // BF16 tensor cores either way (FP8 KV is dequantized)
      const double expanded = 2.0 * kHeads * pairs * (192 + 64 + 256);
      r.note = fmt::format("{} chunk(s); expanded-form equivalent {:.0f} TFLOP/s", plans.size(),
                           expanded / (r.us * 1e6));
      report(r);

      // Expanded form: per chunk, the context's latents expanded by kv_b_proj, then FA3.
      std::vector<std::unique_ptr<at::MlaPrefillExpandedSm90>> eplans;
      std::vector<at::MlaPrefillRunArgs> eargs;
      double gemm_flops = 0;
      for (size_t i = 0; i < batches.size(); ++i) {
        const int c0 = int(i) * kPrefillChunk, c1 = std::min(N, c0 + kPrefillChunk);
        HostBatch hb = make_batch(1, c1, c1 - c0, perm, ps);
        eplans.push_back(std::make_unique<at::MlaPrefillExpandedSm90>(kHeads, kSmScale, c1));
        eplans.back()->plan(hb.view(), ps, pages, s_);
        at::MlaPrefillRunArgs ea;
        ea.q = q_exp.as<uint16_t>() + size_t(c0) * kHeads * at::kExpandedHeadDim;
        ea.kv_b_proj = kv_b.ptr();
        ea.layer = pool.view();
        ea.page_indices = batches[i]->v.page_indices;
        ea.out = out_exp.as<uint16_t>() + size_t(c0) * kHeads * at::kVDim;
        eargs.push_back(ea);
        gemm_flops += 2.0 * c1 * at::kCkvDim * kHeads * (at::kQkNopeDim + at::kVDim);
      }
      Row e{"prefill", kv, "expanded-cublas+fa3-sm90", 1, N};
      e.flops = expanded + gemm_flops;
      e.bytes = r.bytes;
      e.us = time_us([&] {
        for (size_t i = 0; i < eplans.size(); ++i) eplans[i]->run(eargs[i], s_);
      });
      e.floor_us = e.flops / (ceil_.bf16_tflops * 1e6);
      const at::MlaPrefillChoice rule = at::choose_mla_prefill_form(N, N, elem, kHeads);
      e.note = fmt::format("vs absorbed {:.2f}x ({:.0f} % of the flops are the expansion GEMMs); rule picks {} "
                           "(est. {:.0f} / {:.0f} us absorbed / expanded), measured winner {}",
                           r.us / e.us, 100 * gemm_flops / e.flops,
                           rule.form == at::MlaPrefillForm::Expanded ? "expanded" : "absorbed", rule.absorbed_us,
                           rule.expanded_us, e.us < r.us ? "expanded" : "absorbed");
      report(e);
      if (opt_.sparse && N > opt_.top_k && N <= kPrefillChunk) prefill_selection(pool, *batches[0], N, kv, r.us);
    });
  }

  // The DSA selection of a fresh N-token prefill (one chunk, causal): indexer scores of every
  // query against its prefix, then the top-k of each row, beside the dense prefill's time
  // (`dense_us`). Floors: the scores' flops at the BF16 peak (the keys come from L2: 256 B per
  // (query, key) pair, one CTA per query row); one read of the N x N / 2 scores for the top-k.
  void prefill_selection(const Pool& pool, const DevBatch& db, int N, const std::string& kv, double dense_us) {
    const size_t n = size_t(N);
    DeviceMem qi(n * at::kIndexHeads * at::kIndexDim * 2), qi8(n * at::kIndexHeads * at::kIndexDim),
        w(n * at::kIndexHeads * 4), w8(n * at::kIndexHeads * 4), scores(n * n * 4), pos(n * opt_.top_k * 4), ws(1);
    bench::fill_random_bf16(qi.ptr(), n * at::kIndexHeads * at::kIndexDim, 47, 1.0f, s_);
    bench::fill_random_f32(w.as<float>(), n * at::kIndexHeads, 48, -0.5f, 1.0f, s_);
    const Selection sel = make_selection(qi.ptr(), w.as<float>(), qi8.ptr(), w8.as<float>(), pool.view(), db.v, N,
                                         scores.as<float>(), opt_.top_k, pos.as<int32_t>(), nullptr, ws, 0);
    const double pairs = double(N) * (N + 1) / 2;
    Row ri{"prefill-dsa", kv, "indexer-scores", 1, N};
    ri.flops = 2.0 * pairs * at::kIndexHeads * at::kIndexDim;
    ri.bytes = pairs * at::kIndexDim * double(kv_elem_size(pool.elem)) / 2;  // from L2, two tokens per tile
    ri.us = time_us([&] { sel.run_indexer(s_); });
    ri.floor_us = ri.flops / (ceil_.bf16_tflops * 1e6);
    ri.note = fmt::format("two query tokens per CTA; {:.2f}x the dense prefill's time; {:.1f} TB/s of keys from L2",
                          ri.us / dense_us, ri.bytes / (ri.us * 1e6));
    report(ri);
    Row r1 = ri;  // one query token per CTA (the decode layout) on the same chunk
    r1.path = "indexer-scores-1tok";
    r1.bytes = 2 * ri.bytes;
    ix::IndexerScoreArgs one = sel.score;
    one.tokens_per_cta = 1;
    r1.us = time_us([&] { sel.run_indexer_as(one, s_); });
    r1.note = fmt::format("one query token per CTA; {:.2f}x the two-token time; {:.1f} TB/s of keys from L2",
                          r1.us / ri.us, r1.bytes / (r1.us * 1e6));
    report(r1);
    Row rt{"prefill-dsa", kv, "topk", 1, N};
    rt.bytes = pairs * 4;
    rt.us = time_us([&] { sel.run_topk(s_); });
    rt.floor_us = copy_floor_us(rt.bytes);
    rt.note = fmt::format("{:.2f}x the dense prefill's time", rt.us / dense_us);
    report(rt);
  }

  // A step's cache writes for its new tokens (GLM-5 dims, BF16 cache): the runner's unfused
  // sequence (RMSNorm + RoPE of the latent, LayerNorm + RoPE of the index key, the append: 5
  // launches) against the fused pair (kv_latent_prep + index_key_prep: 2 launches). Decode batches
  // (one token per request at position 4095) and one 4096-token prefill chunk. Floor: the
  // projections read and the cache rows written once, at copy bandwidth.
  void key_writes() {
#if defined(FP4MOE_HAVE_GPU_RUNNER)
    namespace eg = fp4moe::engine::gpu;
    constexpr int kCtx = 4096, kRow = at::kCkvDim + at::kKpeDim, kRope = 64;
    for (auto [R, per] : {std::pair{1, 1}, {16, 1}, {64, 1}, {256, 1}, {1, kCtx}}) {
      const int T = R * per, ppr = kCtx / opt_.page_size;
      HostBatch hb;
      std::vector<int32_t> token_req;
      hb.qo_indptr = {0};
      hb.page_indptr = {0};
      for (int r = 0; r < R; ++r) {
        for (int p = kCtx - per; p < kCtx; ++p) hb.positions.push_back(p), token_req.push_back(r);
        hb.qo_indptr.push_back(int32_t(hb.positions.size()));
        hb.kv_len.push_back(kCtx);
        for (int i = 0; i < ppr; ++i) hb.page_indices.push_back(r * ppr + i);
        hb.page_indptr.push_back(int32_t(hb.page_indices.size()));
      }
      DevBatch db(hb, s_);
      auto dreq = upload(token_req, s_);
      Pool pool(KvElem::BF16, opt_.page_size, int64_t(R) * ppr, s_);
      const KvLayerView layer = pool.view();
      DeviceMem kva(size_t(T) * kRow * 2), ik(size_t(T) * at::kIndexDim * 2), ckv(size_t(T) * at::kCkvDim * 2),
          w(at::kCkvDim * 4), lnw(at::kIndexDim * 4), lnb(at::kIndexDim * 4), freq(kRope / 2 * 4);
      bench::fill_random_bf16(kva.ptr(), size_t(T) * kRow, 41, 1.0f, s_);
      bench::fill_random_bf16(ik.ptr(), size_t(T) * at::kIndexDim, 42, 1.0f, s_);
      bench::fill_random_f32(w.as<float>(), at::kCkvDim, 43, 0.5f, 1.5f, s_);
      bench::fill_random_f32(lnw.as<float>(), at::kIndexDim, 44, 0.5f, 1.5f, s_);
      bench::fill_random_f32(lnb.as<float>(), at::kIndexDim, 45, -0.1f, 0.1f, s_);
      bench::fill_random_f32(freq.as<float>(), kRope / 2, 46, 1e-4f, 1.0f, s_);
      const double bytes = double(T) * 2 * 2 * (kRow + at::kIndexDim);  // read + written, BF16
      Row ru{"key-writes", "bf16", "runner-unfused-5", R, per};
      ru.bytes = bytes;
      ru.floor_us = copy_floor_us(bytes);
      eg::DeviceBatch gb;
      gb.tokens = T;
      gb.requests = R;
      gb.qo_indptr = db.v.qo_indptr;
      gb.positions = db.v.positions;
      gb.kv_len = db.v.kv_len;
      gb.page_indptr = db.v.page_indptr;
      gb.page_indices = db.v.page_indices;
      gb.token_req = dreq->as<int32_t>();
      gb.page_size = opt_.page_size;
      auto* k16 = kva.as<uint16_t>();
      auto* i16 = ik.as<uint16_t>();
      ru.us = time_us([&] {
        eg::rms_norm(k16, kRow, T, at::kCkvDim, w.as<float>(), 1e-6f, ckv.as<uint16_t>(), at::kCkvDim, s_);
        eg::rope(k16, T, 1, kRow, 0, at::kCkvDim, kRope, db.v.positions, freq.as<float>(), 1.0f, true, s_);
        eg::layer_norm(i16, T, at::kIndexDim, lnw.as<float>(), lnb.as<float>(), 1e-6f, i16, s_);
        eg::rope(i16, T, 1, at::kIndexDim, 0, 0, kRope, db.v.positions, freq.as<float>(), 1.0f, true, s_);
        eg::kv_append_bf16(layer, gb, ckv.as<uint16_t>(), at::kCkvDim, k16 + at::kCkvDim, kRow, i16, s_);
      });
      ru.note = fmt::format("{} new tokens ({} per request)", T, per);
      report(ru);
      at::KvLatentPrepArgs la;
      la.kv = kva.ptr();
      la.kv_stride = kRow;
      la.norm_w = w.as<float>();
      la.inv_freq = freq.as<float>();
      la.layer = layer;
      la.batch = db.v;
      ix::IndexKeyPrepArgs ka;
      ka.k = ik.ptr();
      ka.ln_w = lnw.as<float>();
      ka.ln_b = lnb.as<float>();
      ka.rope_dim = kRope;
      ka.inv_freq = freq.as<float>();
      ka.layer = layer;
      ka.batch = db.v;
      Row rf = ru;
      rf.path = "fused-2";
      rf.us = time_us([&] {
        at::kv_latent_prep(la, s_);
        ix::index_key_prep(ka, s_);
      });
      rf.note = fmt::format("{} new tokens; {:.2f}x the unfused time", T, rf.us / ru.us);
      report(rf);
    }
#endif
  }

  // FP8 vs FP32 (BF16-exact) indexer selections: B rows of context L, random or model-like data.
  void fp8_agreement(bool model_like, nlohmann::json& out) {
    const int B = 8, L = 32768, k = opt_.top_k;
    const int64_t ps = opt_.page_size, pages = int64_t(B) * L / ps;
    std::mt19937_64 g(model_like ? 91 : 92);
    std::normal_distribution<float> nd(0.f, 1.f);
    // Keys [B * L, 128]; model-like: LayerNorm'd with per-channel gains (a few outliers) and a
    // shared direction; queries of each head lean towards 16 "hot" keys of their row.
    std::vector<float> keys(size_t(B) * L * at::kIndexDim), q(size_t(B) * at::kIndexHeads * at::kIndexDim);
    std::vector<float> gain(at::kIndexDim, 1.f), mu(at::kIndexDim, 0.f);
    if (model_like) {
      for (int d = 0; d < at::kIndexDim; ++d) gain[size_t(d)] = 0.5f + 1.5f * float(g() % 1000) / 1000.f, mu[size_t(d)] = 0.7f * nd(g);
      for (int d = 0; d < 4; ++d) gain[size_t(d * 31)] = 6.f;
    }
    for (size_t t = 0; t < size_t(B) * L; ++t) {
      float* k_row = &keys[t * at::kIndexDim];
      double mean = 0, var = 0;
      for (int d = 0; d < at::kIndexDim; ++d) k_row[d] = nd(g) + mu[size_t(d)], mean += k_row[d];
      mean /= at::kIndexDim;
      for (int d = 0; d < at::kIndexDim; ++d) var += (k_row[d] - mean) * (k_row[d] - mean);
      const float inv = model_like ? float(1.0 / std::sqrt(var / at::kIndexDim + 1e-6)) : 1.f;
      for (int d = 0; d < at::kIndexDim; ++d)
        k_row[d] = model_like ? float((k_row[d] - mean) * inv) * gain[size_t(d)] : k_row[d];
    }
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < at::kIndexHeads; ++h) {
        float* qr = &q[(size_t(b) * at::kIndexHeads + size_t(h)) * at::kIndexDim];
        for (int d = 0; d < at::kIndexDim; ++d) qr[d] = nd(g);
        if (model_like)
          for (int i = 0; i < 16; ++i) {
            const size_t j = size_t(b) * L + g() % size_t(L);
            for (int d = 0; d < at::kIndexDim; ++d) qr[d] += 0.4f * keys[j * at::kIndexDim + size_t(d)];
          }
      }
    std::vector<uint16_t> kb(keys.size()), qb(q.size());
    float amax = 0;
    for (size_t i = 0; i < keys.size(); ++i) kb[i] = float_to_bf16(keys[i]), amax = std::max(amax, std::fabs(keys[i]));
    for (size_t i = 0; i < q.size(); ++i) qb[i] = float_to_bf16(q[i]);
    std::vector<float> wh(size_t(B) * at::kIndexHeads);
    for (auto& x : wh) x = 0.3f * nd(g) + 0.1f;

    // Identity page tables; the BF16 pool is written directly, the FP8 one by kv_append.
    HostBatch hb;
    hb.qo_indptr = {0};
    hb.page_indptr = {0};
    for (int b = 0; b < B; ++b) {
      hb.positions.push_back(L - 1);
      hb.qo_indptr.push_back(b + 1);
      hb.kv_len.push_back(L);
      for (int64_t i = 0; i < L / ps; ++i) hb.page_indices.push_back(int32_t(b * (L / ps) + i));
      hb.page_indptr.push_back(int32_t(hb.page_indices.size()));
    }
    DevBatch db(hb, s_);
    auto d_keys = upload(kb, s_);
    auto d_q = upload(qb, s_);
    auto d_w = upload(wh, s_);
    DeviceMem k8(keys.size()), dummy(size_t(B) * L * at::kCkvDim * 2), q8(q.size()), w8(wh.size() * 4),
        sc(size_t(B) * L * 4), pos32(size_t(B) * k * 4), pos8(size_t(B) * k * 4);
    // kv_append writes ckv / kpe too: one scratch array (BF16) takes both.
    const KvLayerView L8 = glm5_layer(dummy.ptr(), dummy.ptr(), k8.ptr(), pages, ps, KvElem::BF16, KvElem::FP8_E4M3, 1.f, amax / 448.f);
    {  // append all B * L keys (ckv / kpe inputs: the key bytes, reused as scratch values)
      HostBatch fb = hb;
      fb.positions.clear();
      fb.qo_indptr = {0};
      for (int b = 0; b < B; ++b) {
        for (int p = 0; p < L; ++p) fb.positions.push_back(p);
        fb.qo_indptr.push_back(int32_t(fb.positions.size()));
      }
      DevBatch dfb(fb, s_);
      DeviceMem zeros(size_t(B) * L * at::kCkvDim * 2);
      FP4MOE_CUDA_CHECK(cudaMemsetAsync(zeros.ptr(), 0, size_t(B) * L * at::kCkvDim * 2, s_));
      at::KvAppendArgs aa{zeros.ptr(), zeros.ptr(), d_keys->ptr(), L8, dfb.v};
      at::kv_append(aa, s_);
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s_));
    }
    const KvLayerView L16 = glm5_layer(dummy.ptr(), dummy.ptr(), d_keys->ptr(), pages, ps, KvElem::BF16, KvElem::BF16, 1.f, 1.f);
    const size_t topk_ws_bytes = ix::top_k_workspace_bytes(B, L);
    DeviceMem topk_ws(topk_ws_bytes), topk_counts(size_t(B) * 4);
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(topk_ws.ptr(), 0, topk_ws_bytes, s_));
    auto select = [&](const KvLayerView& layer, DeviceMem& dst) {
      const Selection sel = make_selection(d_q->ptr(), d_w->as<float>(), q8.ptr(), w8.as<float>(), layer, db.v, L,
                                           sc.as<float>(), k, dst.as<int32_t>(), nullptr, topk_ws, topk_ws_bytes,
                                           topk_counts.as<int32_t>());
      sel.run_indexer(s_);
      sel.run_topk(s_);
      return sample_note(sel.topk);
    };
    const std::string note32 = select(L16, pos32), note8 = select(L8, pos8);
    std::vector<int32_t> a(size_t(B) * k), b8(size_t(B) * k);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(a.data(), pos32.ptr(), a.size() * 4, cudaMemcpyDeviceToHost, s_));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b8.data(), pos8.ptr(), b8.size() * 4, cudaMemcpyDeviceToHost, s_));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s_));
    double min_overlap = 1, sum = 0;
    int identical = 0;
    for (int r = 0; r < B; ++r) {
      std::set<int32_t> sa(a.begin() + r * k, a.begin() + (r + 1) * k);
      int common = 0;
      for (int i = 0; i < k; ++i) common += int(sa.count(b8[size_t(r * k + i)]));
      const double ov = double(common) / k;
      min_overlap = std::min(min_overlap, ov);
      sum += ov;
      identical += common == k;
    }
    const char* name = model_like ? "model-like" : "random";
    std::printf("| fp8-vs-fp32 selection | %s | rows %d | ctx %d | mean overlap %.2f %% | min %.2f %% | identical sets %d/%d | "
                "top-k: BF16 %s, FP8 %s |\n",
                name, B, L, 100 * sum / B, 100 * min_overlap, identical, B, note32.c_str(), note8.c_str());
    out.push_back({{"data", name}, {"rows", B}, {"ctx", L}, {"top_k", k}, {"mean_overlap", sum / B},
                   {"min_overlap", min_overlap}, {"identical_rows", identical}, {"topk_bf16", note32}, {"topk_fp8", note8}});
  }

  void report(Row& r) {
    const double gbps = r.bytes / (r.us * 1e3), tflops = r.flops / (r.us * 1e6);
    std::printf("| %-13s | %-8s | %-24s | %4d | %6d | %10.1f | %7.0f | %6.1f | %5.1f %% | %5.1f %% | %5.2fx | %s\n",
                r.kind.c_str(), r.kv.c_str(), r.path.c_str(), r.batch, r.ctx, r.us, gbps, tflops,
                100 * gbps / ceil_.copy_gbps, 100 * tflops / ceil_.bf16_tflops, r.us / r.floor_us, r.note.c_str());
    std::fflush(stdout);
    rows.push_back(r);
  }

 private:
  const Options& opt_;
  cudaStream_t s_;
  bench::ColdL2Timer timer_;
  bench::Ceilings ceil_;
  int failures_ = 0;
};

int run_bench(const Options& opt) {
  FP4MOE_CHECK(opt.iters >= 1, "--iters must be >= 1");
  bench::l2_flush_from(opt.l2_flush);  // a bad value: one line, before any GPU work
  FP4MOE_CHECK(at::log2_exact(opt.page_size) >= 0, "--page-size {} must be a power of two", opt.page_size);
  FP4MOE_CHECK(opt.top_k >= 1 && opt.top_k <= ix::kMaxTopK, "--top-k {} outside [1, {}]", opt.top_k, ix::kMaxTopK);
  for (int b : opt.batches) FP4MOE_CHECK(b >= 1 && b <= 4096, "--batch {} outside [1, 4096]", b);
  for (int c : opt.contexts) FP4MOE_CHECK(c >= 1 && c <= (1 << 20), "--ctx {} outside [1, 2^20]", c);
  for (int n : opt.prefill) FP4MOE_CHECK(n >= 1 && n <= (1 << 17), "--prefill {} outside [1, 131072]", n);
  std::vector<KvElem> elems;
  for (const auto& k : opt.kv) {
    FP4MOE_CHECK(k == "bf16" || k == "fp8", "--kv {}: bf16 or fp8", k);
    elems.push_back(k == "bf16" ? KvElem::BF16 : KvElem::FP8_E4M3);
  }
  FP4MOE_CHECK(cuda::device_available(), "bench attention needs a CUDA GPU");
  const int sm = cuda::current_device().cc;
  const std::string why = at::mla_can_implement({kHeads, kSmScale, KvElem::BF16}, sm);
  FP4MOE_CHECK(why.empty(), "bench attention: {}", why);
  cudaStream_t s;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Bench b(opt, s);
  const auto& c = b.ceilings();
  std::printf("device: %s (sm_%d)  copy %.0f GB/s  bf16 %.0f TFLOP/s  fp8 %.0f TFLOP/s (cuBLASLt 8192^3)\n",
              cuda::current_device().name.c_str(), sm, c.copy_gbps, c.bf16_tflops, c.fp8_tflops);
  std::printf("GLM-5 MLA: 64 heads, latent 512 + rope 64; indexer 32 x 128, top-%d; page size %d; L2 flushed by %s\n",
              opt.top_k, opt.page_size, opt.l2_flush == "read" ? "a read (clean lines)" : "a memset (dirty lines)");
  std::printf("| kind          | kv       | path                     |    B |    ctx |         us |    GB/s | TFLOP/s | %% copy | %% bf16 | x floor | note\n");
  for (KvElem e : elems) b.guard("decode", [&] { b.decode(e); });
  if (opt.do_prefill)
    for (KvElem e : elems) b.guard("prefill", [&] { b.prefill(e); });
  if (opt.key_writes) b.guard("key writes", [&] { b.key_writes(); });
  nlohmann::json agreement = nlohmann::json::array();
  if (opt.fp8_agreement) {
    b.guard("fp8 agreement (random)", [&] { b.fp8_agreement(false, agreement); });
    b.guard("fp8 agreement (model-like)", [&] { b.fp8_agreement(true, agreement); });
  }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  if (!opt.json_path.empty()) {
    nlohmann::json j;
    j["device"] = cuda::current_device().name;
    j["commit"] = std::getenv("FP4MOE_COMMIT") ? std::getenv("FP4MOE_COMMIT") : "unknown";
    j["ceilings"] = {{"copy_gbps", c.copy_gbps}, {"bf16_tflops", c.bf16_tflops}, {"fp8_tflops", c.fp8_tflops}};
    j["page_size"] = opt.page_size;
    j["top_k"] = opt.top_k;
    j["l2_flush"] = opt.l2_flush;
    nlohmann::json rs = nlohmann::json::array();
    for (const Row& r : b.rows)
      rs.push_back({{"kind", r.kind}, {"kv", r.kv}, {"path", r.path}, {"batch", r.batch}, {"ctx", r.ctx},
                    {"us", r.us}, {"bytes", r.bytes}, {"flops", r.flops}, {"floor_us", r.floor_us},
                    {"x_floor", r.us / r.floor_us}, {"note", r.note}});
    j["results"] = rs;
    j["fp8_selection"] = agreement;
    std::ofstream f(opt.json_path);
    FP4MOE_CHECK(f.good(), "cannot write {}", opt.json_path);
    f << j.dump(2) << "\n";
  }
  FP4MOE_CHECK(b.failures() == 0, "bench attention: {} case(s) failed (see the table)", b.failures());
  return 0;
}
#endif

void setup(CLI::App& app, std::function<int()>& run) {
  auto opt = std::make_shared<Options>();
  app.add_option("--batch", opt->batches, "decode batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--ctx", opt->contexts, "decode context lengths")->delimiter(',')->capture_default_str();
  app.add_option("--prefill", opt->prefill, "prefill lengths (one fresh request each)")->delimiter(',')
      ->capture_default_str();
  app.add_option("--kv", opt->kv, "KV cache element types: bf16, fp8")->delimiter(',')->capture_default_str();
  app.add_option("--page-size", opt->page_size, "tokens per page (power of two)")->capture_default_str();
  app.add_option("--top-k", opt->top_k, "indexer top-k")->capture_default_str();
  app.add_option("--iters", opt->iters, "timed runs per case (median, cold L2)")->capture_default_str();
  app.add_option("--json", opt->json_path, "write the results as JSON");
  add_l2_flush_option(app, opt->l2_flush);
  app.add_flag("!--no-sparse", opt->sparse, "skip the sparse (indexer + top-k + sparse MLA) decode path");
  app.add_flag("!--no-prefill", opt->do_prefill, "skip prefill");
  app.add_flag("!--no-fp8-agreement", opt->fp8_agreement, "skip the FP8-vs-FP32 selection comparison");
  app.add_flag("!--no-key-writes", opt->key_writes, "skip the cache-write comparison (the runner's unfused norms + RoPE + append vs the fused kernels)");
  run = [opt] {
#if defined(FP4MOE_HAVE_CUDA)
    return run_bench(*opt);
#else
    FP4MOE_FAIL("bench attention: this fp4moe was built without CUDA");
    return 1;
#endif
  };
}

Registrar reg{"bench attention", "Benchmark MLA attention and the DSA indexer (GLM-5 dims) against their floors",
              setup};

}  // namespace
}  // namespace fp4moe::cli
