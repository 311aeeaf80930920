// Internal to `fp4moe bench attention`: its options, the cases' device data (a GLM-5 layer's
// paged pool, decode batches, the DSA selection) and the Bench runner whose parts live in
// bench_attention.cpp (row helpers), bench_attention_decode.cpp and bench_attention_prefill.cpp;
// cmd_bench_attention.cpp registers the command.
#pragma once

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
#include "cuda/attention/mla_warp_bf16.hpp"
#include "cuda/norm/norm.hpp"
#include "cuda/rope/rope.hpp"
#endif
#endif

namespace fp4moe::cli::attn_bench {

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
inline std::unique_ptr<DeviceMem> upload(const std::vector<T>& h, cudaStream_t s) {
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
inline KvLayerView glm5_layer(void* ckv, void* kpe, void* index_k, int64_t pages, int64_t page_size, KvElem elem,
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
inline HostBatch make_batch(int B, int L, int q_len, const std::vector<int32_t>& perm, int64_t page_size) {
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
inline Selection make_selection(const void* q, const float* w, void* q8, float* w8, const KvLayerView& layer,
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
                        const void* q_nope, const void* q_pe, void* out);
  // The score kernel with the runner's query RoPE (interleaved, 64 dims, GLM-5's frequencies)
  // and BF16 head weights fused into it, beside the plain scores (`plain` its row): what the
  // fused prologue costs a CTA.
  void fused_query_row(const Selection& sel, const Row& plain);

  // The score kernel split by the rule before 2026-12-05 (~4 waves of 2 CTAs per SM, so one
  // 128-key tile per CTA below ~1K tiles per token x batch) beside the default one-wave split
  // (`plain` its row, `tiles` its tiles per CTA); skipped where the two rules agree.
  void waves_split_row(const Selection& sel, const Row& plain, int tiles);

  // FlashInfer's DSA top-k on the same scores (the baseline of ours, `ours` its row): time, and in
  // how many rows it selects the same set as ours did last (as sets: its order differs).
  void flashinfer_topk_row(const Selection& sel, const KvBatchView& b, const Row& ours, int64_t page_size);

  // Rows longer than 16K keys: how many the last top-k call streamed (its sample missed).
  std::string sample_note(const ix::TopKArgs& a) {
    const ix::TopKSampleStats st = ix::top_k_sample_stats(a, s_);
    if (st.long_rows == 0) return "";
    return fmt::format("streamed {}/{} rows; median {} candidates", st.streamed, st.long_rows, st.median_candidates);
  }

  // Decode, every batch x context (bench_attention_decode.cpp): dense MLA (FlashInfer, ours, both
  // schedules, the floor kernels) and the sparse path's stages, pipeline and graphs.
  void decode(KvElem elem);

  // Prefill of one fresh request per length, in both forms (bench_attention_prefill.cpp).
  void prefill(KvElem elem);

  // The DSA selection of a fresh N-token prefill (one chunk, causal): indexer scores of every
  // query against its prefix, then the top-k of each row, beside the dense prefill's time
  // (`dense_us`). Floors: the scores' flops at the BF16 peak (the keys come from L2: 256 B per
  // (query, key) pair, one CTA per query row); one read of the N x N / 2 scores for the top-k.
  void prefill_selection(const Pool& pool, const DevBatch& db, int N, const std::string& kv, double dense_us);

  // A step's cache writes for its new tokens (GLM-5 dims, BF16 cache): the runner's unfused
  // sequence (RMSNorm + RoPE of the latent, LayerNorm + RoPE of the index key, the append: 5
  // launches) against the fused pair (kv_latent_prep + index_key_prep: 2 launches). Decode batches
  // (one token per request at position 4095) and one 4096-token prefill chunk. Floor: the
  // projections read and the cache rows written once, at copy bandwidth.
  void key_writes();

  // FP8 vs FP32 (BF16-exact) indexer selections: B rows of context L, random or model-like data.
  void fp8_agreement(bool model_like, nlohmann::json& out);

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

#endif  // FP4MOE_HAVE_CUDA

}  // namespace fp4moe::cli::attn_bench
