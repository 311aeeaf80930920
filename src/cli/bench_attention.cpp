// `bench attention`: the rows measured beside a stage (floor kernels, other splits and paths, FlashInfer's top-k).
#include "cli/bench_attention.hpp"

#if defined(FP4MOE_HAVE_CUDA)
namespace fp4moe::cli::attn_bench {

// The sparse pipeline's bytes moved by the floor kernels as one graph (`graph` its row, timed
// the same way): one launch per stage (the index keys in and the scores out; the scores in and
// the selection out; the selected latents and the queries in and the output out), then the same
// three with empty launches added up to the pipeline graph's count. The first is what any
// three-launch pipeline needs at this size, the second what the pipeline's launch count costs
// before its kernels do any work.
void Bench::floor_chain_rows(const Row& graph, int launches, const Pool& pool, double key_bytes, void* scores,
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
void Bench::fused_query_row(const Selection& sel, const Row& plain) {
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
void Bench::waves_split_row(const Selection& sel, const Row& plain, int tiles) {
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
void Bench::flashinfer_topk_row(const Selection& sel, const KvBatchView& b, const Row& ours, int64_t page_size) {
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

}  // namespace fp4moe::cli::attn_bench
#endif  // FP4MOE_HAVE_CUDA
