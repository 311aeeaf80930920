// GpuRunner::decode_greedy / decode_sampled: K decode steps per launch. The step metadata goes
// up once (upload_meta, as for step()), plus the launch's limits (max_new, stop ids) and, when
// sampled, the rows' sampling parameters and penalty histories (upload_sampling); then K times
// [forward (the bucket's graph replayed, or eager) → (sample(j) →) greedy_advance(j)] on the
// stream, the per-expert counts of each step copied aside on the device; the tokens, logprobs,
// counts and the last logits come back in one synchronisation.
//
// The bookkeeping between steps is greedy_advance (cuda/step/step.hpp), not cuda/sampling's
// decode_advance: the runner's forward reads positions, kv_len and page tables (upload_meta's
// layout) rather than decode_advance's per-row kv_slot, and a finished row must become a dummy
// on the trash page; greedy_advance does that, and for sampled launches also advances the draw
// index and appends the token to the penalty history as decode_advance would.
#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"

namespace fp4moe::engine::gpu {

namespace {

void decode_launch(GpuRunner::Impl& m, const DecodeInput& in, bool sampled, std::vector<int32_t>& tokens_out,
                   std::vector<int32_t>& produced, std::vector<GeneratedToken>* details,
                   std::vector<int32_t>* expert_counts, std::vector<float>* last_logits) {
  StepCounters& c = m.counters;
  const KvBatchView& b = in.batch;
  const int64_t B = b.num_requests, K = in.steps, ps = m.opt.page_size;
  FP4MOE_CHECK(B >= 1 && b.num_tokens == B, "decode: {} tokens for {} requests (one each)", b.num_tokens, B);
  FP4MOE_CHECK(K >= 1 && K <= c.kmax, "decode: {} steps per launch (1 .. {}, max_decode_steps)", K, c.kmax);
  FP4MOE_CHECK(in.tokens && b.qo_indptr && b.positions && b.kv_len && b.page_indptr && b.page_indices,
               "decode: a batch array is missing");
  FP4MOE_CHECK(in.stop_ids.empty() || int64_t(in.stop_ids.size()) == B, "decode: stop ids for {} of {} requests",
               in.stop_ids.size(), B);
  FP4MOE_CHECK(!expert_counts || m.opt.count_experts, "decode: expert counts asked for, but count_experts is off");
  FP4MOE_CHECK(!sampled || int64_t(in.sampling.size()) == B, "decode: sampling rows for {} of {} requests",
               in.sampling.size(), B);
  const int64_t limit = std::min<int64_t>(m.opt.max_context, m.cfg.max_position_embeddings);
  for (int64_t r = 0; r < B; ++r) {
    FP4MOE_CHECK(b.qo_indptr[r] == r && b.qo_indptr[r + 1] == r + 1, "decode: request {} has {} tokens (one each)",
                 r, b.qo_indptr[r + 1] - b.qo_indptr[r]);
    const int64_t mn = in.max_new ? in.max_new[r] : K;
    FP4MOE_CHECK(mn >= 1, "decode: request {}: max_new {} (>= 1)", r, mn);
    const int64_t p = b.positions[r], writes = std::min(K, mn);
    FP4MOE_CHECK(b.kv_len[r] == p + 1, "decode: request {}: kv_len {} for its token at position {}", r, b.kv_len[r], p);
    FP4MOE_CHECK(p >= 0 && p + writes <= limit,
                 "decode: request {}: positions {} .. {} beyond the runner's max context {} (or max_position_embeddings)",
                 r, p, p + writes - 1, limit);
    const int64_t pages = b.page_indptr[r + 1] - b.page_indptr[r];
    FP4MOE_CHECK(pages * ps >= p + writes, "decode: request {}: {} pages hold {} positions, the launch writes up to {}",
                 r, pages, pages * ps, p + writes - 1);
    if (!in.stop_ids.empty())
      FP4MOE_CHECK(int64_t(in.stop_ids[size_t(r)].size()) <= c.stops, "decode: request {}: {} stop ids (at most {})", r,
                   in.stop_ids[size_t(r)].size(), c.stops);
  }

  StepInput si;
  si.tokens = in.tokens;
  si.batch = b;
  si.logits_rows.resize(size_t(B));
  for (int64_t r = 0; r < B; ++r) si.logits_rows[size_t(r)] = int32_t(r);
  SampleLaunch sl;
  if (sampled) sl = m.upload_sampling(in.sampling, K);  // checks the rows before anything runs
  const GraphEntry* g = m.decode_graph(B);
  const int64_t pad = g ? g->bucket : 0;
  m.upload_meta(si, pad);  // validates the batch; the first step's metadata
  m.clear_token_masks();   // K-step launches run unconstrained batches (the scheduler's rule)

  // The launch's limits: max_new, stop ids (-1 padded to this launch's most per request, so
  // greedy_advance reads what the requests have, not the runner's cap), produced = 0.
  int64_t stops = 0;
  for (const auto& ids : in.stop_ids) stops = std::max<int64_t>(stops, int64_t(ids.size()));
  int32_t* h = c.dec_host.p;
  std::fill(h, h + c.in_ints(), -1);
  for (int64_t r = 0; r < B; ++r) {
    h[r] = in.max_new ? in.max_new[r] : int32_t(K);
    if (!in.stop_ids.empty()) std::copy(in.stop_ids[size_t(r)].begin(), in.stop_ids[size_t(r)].end(), h + c.rm + r * stops);
    h[c.rm * (c.stops + 1) + r] = 0;
  }
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(c.dec.ptr(), h, c.in_ints() * 4, cudaMemcpyHostToDevice, m.stream));

  GreedyAdvanceArgs a;
  a.requests = int32_t(B);
  a.stop_stride = int32_t(stops);
  a.trash_page = int32_t(m.trash_page);
  a.greedy = m.s.greedy;
  a.tokens = m.meta.tokens;
  a.positions = m.meta.positions;
  a.kv_len = m.meta.kv_len;
  a.page_indptr = m.meta.page_indptr;
  a.page_indices = m.meta.page_indices;
  a.active = m.meta.active;
  a.max_new = c.max_new();
  a.stop_ids = c.stop_ids();
  a.produced = c.produced();
  a.out = c.out();
  if (sampled) {
    a.draw = sl.draw;
    a.output_len = sl.output_len;
    a.prompt_len = sl.prompt_len;
    a.history = sl.history_stride > 0 ? m.s.sample_hist : nullptr;
    a.history_stride = sl.history_stride;
    a.done = sl.done;
  }
  const size_t nc = size_t(c.moe_layers * c.experts);
  int max_ctx = 1;
  for (int64_t r = 0; r < B; ++r) max_ctx = std::max(max_ctx, b.positions[r] + int(K));
  if (g) max_ctx = int(m.opt.max_context);  // as captured
  const int Tp = int(std::max(B, pad));
  for (int64_t j = 0; j < K; ++j) {
    m.poison_activations();
    if (g && m.graphs_enabled) {
      FP4MOE_CUDA_CHECK(cudaGraphLaunch(g->exec, m.stream));
      ++m.stats.graph_steps;
    } else {
      m.forward(Tp, int(B + (Tp - B)), Tp, max_ctx, true, nullptr);
      ++m.stats.eager_steps;
    }
    if (expert_counts && nc > 0)
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(c.step_counts.as<int32_t>() + size_t(j) * nc, c.counts.ptr(), nc * 4,
                                        cudaMemcpyDeviceToDevice, m.stream));
    if (sampled) {
      m.run_sample(sl, m.s.logits, j);
      a.greedy = m.s.sample_out + j * B;  // run_sample's tokens of step j
    }
    greedy_advance(a, int32_t(j), m.stream);
  }

  // Results: tokens [K, B] then produced [B] into the pinned decode block, counts, logits.
  int32_t* ho = h + c.in_ints();
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(ho, c.out(), size_t(K * B) * 4, cudaMemcpyDeviceToHost, m.stream));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h, c.produced(), size_t(B) * 4, cudaMemcpyDeviceToHost, m.stream));
  if (expert_counts && nc > 0)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(c.counts_host.p, c.step_counts.ptr(), size_t(K) * nc * 4, cudaMemcpyDeviceToHost,
                                      m.stream));
  if (sampled && details) m.read_sampled(sl, K);
  if (last_logits) {
    last_logits->resize(size_t(B * m.cfg.vocab));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(last_logits->data(), m.s.logits, last_logits->size() * 4, cudaMemcpyDeviceToHost,
                                      m.stream));
  }
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  tokens_out.assign(ho, ho + K * B);
  produced.assign(h, h + B);
  if (expert_counts) expert_counts->assign(c.counts_host.p, c.counts_host.p + size_t(K) * nc);
  if (sampled && details) {
    details->clear();
    for (int64_t j = 0; j < K; ++j)
      for (int64_t r = 0; r < B; ++r) details->push_back(m.sampled_token(sl, K, j, r));
  }
}

}  // namespace

void GpuRunner::decode_greedy(const DecodeInput& in, std::vector<int32_t>& tokens_out, std::vector<int32_t>& produced,
                              std::vector<int32_t>* expert_counts, std::vector<float>* last_logits) {
  try {
    decode_launch(*impl_, in, false, tokens_out, produced, nullptr, expert_counts, last_logits);
  } catch (const cuda::OutOfMemory&) {
    impl_->rethrow_out_of_memory("running a K-step decode launch");
  }
}

void GpuRunner::decode_sampled(const DecodeInput& in, std::vector<int32_t>& tokens_out, std::vector<int32_t>& produced,
                               std::vector<GeneratedToken>* details, std::vector<int32_t>* expert_counts,
                               std::vector<float>* last_logits) {
  try {
    decode_launch(*impl_, in, true, tokens_out, produced, details, expert_counts, last_logits);
  } catch (const cuda::OutOfMemory&) {
    impl_->rethrow_out_of_memory("running a K-step decode launch");
  }
}

}  // namespace fp4moe::engine::gpu
