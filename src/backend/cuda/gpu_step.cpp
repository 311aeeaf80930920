// GpuRunner::step: validation, the one metadata upload, eager forward (model/'s layer stack
// with the CUDA op set) or a decode graph's replay, device sampling (gpu_sample.cpp), results
// back; graph capture per batch-size bucket.
#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/common/cuda_check.hpp"
#include "backend/cuda/cuda_ops.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"
#include "model/layer_stack.hpp"

namespace fp4moe::engine::gpu {

DeviceBatch GpuRunner::Impl::batch(int T, int R) const {
  DeviceBatch b;
  b.tokens = T;
  b.requests = R;
  b.qo_indptr = meta.qo_indptr;
  b.positions = meta.positions;
  b.kv_len = meta.kv_len;
  b.page_indptr = meta.page_indptr;
  b.page_indices = meta.page_indices;
  b.token_req = meta.token_req;
  b.page_size = int32_t(opt.page_size);
  return b;
}

// MlaSm90 takes the step when: it exists (sm_90, FlashInfer, heads a power of two <= 128), the
// model has a dense-attention layer, the step is not a decode step, its host batch is known
// (eager step()), every request has >= 1 new token at the end of its context (the kernel's
// causal rule), and the schedule fits (FlashInfer's bound on work items, as MlaSm90::plan_impl).
void GpuRunner::Impl::plan_prefill(int T, bool decode) {
  prefill_planned = false;
  if (!mla_prefill || decode || !host_batch || host_batch->num_tokens != T) return;
  const KvBatchView& b = *host_batch;
  const int64_t H = cfg.num_heads;
  if (T * H / 64 + b.num_requests + 1024 > cuda::attention::MlaSm90::kMaxWorks) return;
  for (int64_t r = 0; r < b.num_requests; ++r) {
    const int32_t q = b.qo_indptr[r + 1] - b.qo_indptr[r];
    if (q < 1) return;
    for (int32_t j = 0; j < q; ++j)
      if (b.positions[b.qo_indptr[r] + j] != b.kv_len[r] - q + j) return;
  }
  mla_prefill->plan(b, opt.page_size, kv_layers.empty() ? num_pages : kv_layers[0].num_pages, stream);
  prefill_planned = true;
}

// The step's forward: model/'s layer stack (model/layer_stack.hpp) with the CUDA op set
// (cuda_ops.hpp) over the runner's workspace and the uploaded metadata. Enqueue only: the same
// sequence runs eager or captured in a decode graph.
void GpuRunner::Impl::forward(int T, int R, int rows, int max_ctx, bool decode, model::HiddenStates* hidden,
                              StepChoices* choices) {
  const model::MlaModelConfig& c = cfg;
  const int64_t H = c.hidden;
  plan_prefill(T, decode);
  if (choices) {
    *choices = StepChoices{};
    choices->router_logits.resize(size_t(c.num_layers));
    choices->expert_ids.resize(size_t(c.num_layers));
    choices->topk_positions.resize(size_t(c.num_layers));
  }
  CudaOps ops(*this, T, R, max_ctx, decode, choices);
  model::ForwardViews v;
  v.tokens = TensorView::of(meta.tokens, {T}, Device::Cuda);
  v.x = TensorView::of(s.x, {T, H}, Device::Cuda);
  v.h = TensorView::contiguous(s.h, DType::BF16, {T, H}, Device::Cuda);
  v.o = TensorView::contiguous(s.o, DType::BF16, {T, H}, Device::Cuda);
  v.rows = TensorView::of(meta.rows, {rows}, Device::Cuda);
  v.logits = TensorView::of(s.logits, {rows, c.vocab}, Device::Cuda);
  v.hidden = hidden;
  model::forward(ops, c, v);
}

void GpuRunner::Impl::mark(StepStage st) {
  if (!marks) return;
  StageMarks& m = *marks;
  if (m.used == m.events.size()) {
    cudaEvent_t e = nullptr;
    FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
    m.events.push_back(e);
    m.stage.push_back(st);
  }
  m.stage[m.used] = st;
  FP4MOE_CUDA_CHECK(cudaEventRecord(m.events[m.used], stream));
  ++m.used;
}


void GpuRunner::Impl::upload_meta(const StepInput& in, int64_t pad_to) {
  fill_meta(in, pad_to);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(meta_dev.ptr(), meta_host, meta.ints * 4, cudaMemcpyHostToDevice, stream));
}

void GpuRunner::Impl::fill_meta(const StepInput& in, int64_t pad_to) {
  const KvBatchView& b = in.batch;
  const int64_t T = b.num_tokens, R = b.num_requests, rows = int64_t(in.logits_rows.size());
  const int64_t Tp = std::max(T, pad_to), Rp = R + (Tp - T);
  FP4MOE_CHECK(Tp <= meta.max_tokens, "step of {} tokens: the runner was sized for {} (--max-tokens)", Tp,
               meta.max_tokens);
  FP4MOE_CHECK(Rp <= meta.max_requests, "step of {} requests: the runner was sized for {}", Rp, meta.max_requests - 1);
  if (T > 0) {
    validate_kv_batch(b, opt.page_size, num_pages);
    for (int64_t t = 0; t < T; ++t) {
      FP4MOE_CHECK(in.tokens[t] >= 0 && in.tokens[t] < cfg.vocab, "token id {} is out of the vocabulary (0 .. {})",
                   in.tokens[t], cfg.vocab - 1);
      FP4MOE_CHECK(b.positions[t] < opt.max_context && b.positions[t] < cfg.max_position_embeddings,
                   "position {} is beyond the runner's max context {} (or max_position_embeddings {})", b.positions[t],
                   opt.max_context, cfg.max_position_embeddings);
    }
  }
  for (int32_t r : in.logits_rows) FP4MOE_CHECK(r >= 0 && r < T, "logits row {} of a step of {} tokens", r, T);
  FP4MOE_CHECK(std::max(rows, Tp > T ? Tp : int64_t(0)) <= logits_rows,
               "step asks for {} logits rows: the runner was planned for {} (RunnerOptions::max_logits_rows)",
               std::max(rows, Tp > T ? Tp : int64_t(0)), logits_rows);
  const int64_t entries = (T > 0 ? b.page_indptr[R] : 0) + (Tp - T);
  FP4MOE_CHECK(entries <= meta.max_page_entries, "step page tables: {} entries, room for {}", entries,
               meta.max_page_entries);

  int32_t* h = meta_host;
  auto at = [&](const int32_t* dev) { return h + (dev - meta_dev.as<int32_t>()); };
  int32_t *tok = at(meta.tokens), *pos = at(meta.positions), *req = at(meta.token_req), *qo = at(meta.qo_indptr),
          *len = at(meta.kv_len), *pp = at(meta.page_indptr), *pi = at(meta.page_indices), *rw = at(meta.rows),
          *off = at(meta.offsets), *act = at(meta.active);
  if (T > 0) {
    std::copy(in.tokens, in.tokens + T, tok);
    std::copy(b.positions, b.positions + T, pos);
    kv_token_requests(b, req);
    const size_t nr = size_t(std::max<int64_t>(R, 0));  // R >= 1 here (validated); says so to GCC's -Wstringop-overflow
    std::copy_n(b.qo_indptr, nr + 1, qo);
    std::copy_n(b.kv_len, nr, len);
    std::copy_n(b.page_indptr, nr + 1, pp);
    std::copy(b.page_indices, b.page_indices + b.page_indptr[R], pi);
    for (int64_t r = 0; r < R; ++r) act[r] = 1;
  } else {
    qo[0] = pp[0] = 0;
  }
  // Padding: one dummy request per padding token, position 0 on the trash page.
  for (int64_t i = 0; i < Tp - T; ++i) {
    const int64_t t = T + i, r = R + i;
    tok[t] = 0;
    pos[t] = 0;
    req[t] = int32_t(r);
    qo[r + 1] = int32_t(t + 1);
    len[r] = 1;
    act[r] = 0;
    pi[pp[r]] = int32_t(trash_page);
    pp[r + 1] = pp[r] + 1;
  }
  std::copy(in.logits_rows.begin(), in.logits_rows.end(), rw);
  for (int64_t i = rows; i < Tp && pad_to > 0; ++i) rw[i] = int32_t(i);  // graphs compute every row
  off[0] = 0;
  off[1] = int32_t(Tp);
}

GraphEntry GpuRunner::Impl::capture_bucket(int64_t B, const std::function<void()>& forward) {
  forward();  // warm-up: plans, lazy loading
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t g = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    forward();
  } catch (...) {
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  FP4MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  GraphEntry e;
  e.bucket = B;
  FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&e.exec, g, 0));
  FP4MOE_CUDA_CHECK(cudaGraphDestroy(g));
  FP4MOE_CUDA_CHECK(cudaGraphUpload(e.exec, stream));
  return e;
}

void GpuRunner::Impl::capture_graphs() {
  const int64_t gmax = std::min({opt.cuda_graph_max_bs < 0 ? opt.max_requests : opt.cuda_graph_max_bs,
                                 opt.max_tokens, opt.max_requests});
  const auto t0 = std::chrono::steady_clock::now();
  size_t free0 = 0, free1 = 0, total = 0;
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  const std::vector<int64_t> buckets = graph_buckets(gmax);
  for (int64_t B : buckets) {
    StepInput none;
    upload_meta(none, B);
    graphs[B] = capture_bucket(B, [&] { forward(int(B), int(B), int(B), int(opt.max_context), true, nullptr); });
  }
  capture_mtp_graphs(buckets);  // the MTP layer's draft steps (RunnerOptions::mtp), gpu_mtp.cpp
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  stats.graph_capture_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.graph_bytes = int64_t(free0) - int64_t(free1);
  graph_line = fmt::format("cuda graphs: {} decode buckets (batch 1 .. {}){} captured in {:.2f} s, {:.3f} GB of device "
                           "memory (the memory plan kept ~{:.3f} GB free for them beside the KV pool); eager above {}",
                           buckets.size(), gmax, mtp_graphs.empty() ? "" : " and the MTP layer's draft steps in each",
                           stats.graph_capture_seconds, double(stats.graph_bytes) / 1e9,
                           double(plan.graph_bytes) / 1e9, gmax);
}

const GraphEntry* GpuRunner::Impl::decode_graph(int64_t B) {
  if (graphs.empty()) return nullptr;
  auto it = graphs.lower_bound(B);
  if (it != graphs.end()) return &it->second;
  if (!said_eager) {
    said_eager = true;
    log_info("gpu runner: decode batch {} is above --cuda-graph-max-bs {}: such steps run eager", B,
             graphs.rbegin()->first);
  }
  return nullptr;
}

void GpuRunner::Impl::poison_activations() {
  if (!opt.poison) return;  // activations NaN before the step (not the MoE / router counters, placed last)
  const size_t n = size_t(static_cast<uint8_t*>(s.moe_ws) - workspace.as<uint8_t>());
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(workspace.ptr(), 0xFF, n, stream));
}

void GpuRunner::step(const StepInput& in, const StepOutput& out) {
  try {
    impl_->run_step(in, out);
  } catch (const cuda::OutOfMemory&) {
    impl_->rethrow_out_of_memory("running a step");
  }
}

void GpuRunner::Impl::run_step(const StepInput& in, const StepOutput& out) {
  Impl& m = *this;
  const KvBatchView& b = in.batch;
  const int64_t T = b.num_tokens, R = b.num_requests, rows = int64_t(in.logits_rows.size());
  FP4MOE_CHECK(T >= 1 && R >= 1, "step: empty batch ({} tokens, {} requests)", T, R);
  FP4MOE_CHECK(!out.expert_counts || m.opt.count_experts, "step: expert counts asked for, but count_experts is off");
  // One token per request, the last of its context (the fast decode attention reads keys
  // [0, kv_len), the own kernel positions 0 .. p: the same only then).
  bool one_each = T == R && b.qo_indptr && b.positions && b.kv_len;
  for (int64_t r = 0; one_each && r < R; ++r)
    one_each = b.qo_indptr[r] == r && b.qo_indptr[r + 1] == r + 1 && b.positions[r] == b.kv_len[r] - 1;
  bool decode = one_each && rows == T;
  for (int64_t i = 0; decode && i < rows; ++i) decode = in.logits_rows[size_t(i)] == i;
  // A decode batch within the graph buckets runs padded to its bucket, replayed, or eager over
  // the same padded batch (graphs disabled, or stage times asked for): bit for bit the same.
  // Per-layer results (hidden states, choices) run eager and unpadded.
  const bool per_layer = out.hidden || out.choices;
  const GraphEntry* g = decode && !per_layer ? m.decode_graph(T) : nullptr;
  // Device sampling: the rows' parameters checked and uploaded first (a bad row throws before
  // the forward); sample() runs after the logits (and their copy, when asked for).
  const int64_t ns = int64_t(in.sampling.size());
  FP4MOE_CHECK(ns == 0 || out.sampled, "step: device sampling rows without StepOutput::sampled");
  FP4MOE_CHECK(ns <= rows, "step: {} device sampling rows for {} logits rows", ns, rows);
  SampleLaunch sl;
  if (ns > 0) sl = m.upload_sampling(in.sampling, 0);
  FP4MOE_CHECK(in.token_masks.empty() || in.token_masks.size() == size_t(rows),
               "step: {} token masks for {} logits rows", in.token_masks.size(), rows);
  // Masks still being filled (await_token_masks): the forward runs unmasked, then the host waits
  // for them while it runs, and they are applied (and the greedy argmax redone) after it.
  const bool late_masks = !in.token_masks.empty() && in.await_token_masks;
  m.upload_token_masks(late_masks ? std::span<const uint32_t* const>{} : std::span(in.token_masks));
  m.poison_activations();
  if (out.device_ms) FP4MOE_CUDA_CHECK(cudaEventRecord(m.ev_begin, m.stream));
  if (g && m.graphs_enabled && !out.stages) {
    m.upload_meta(in, g->bucket);
    FP4MOE_CUDA_CHECK(cudaGraphLaunch(g->exec, m.stream));
    ++m.stats.graph_steps;
  } else {
    const int64_t pad = g ? g->bucket : 0;
    m.upload_meta(in, pad);
    int max_ctx = 1;
    for (int64_t t = 0; t < T; ++t) max_ctx = std::max(max_ctx, b.positions[t] + 1);
    if (g) max_ctx = int(m.opt.max_context);  // as captured
    const int Tp = int(std::max(T, pad));
    if (out.stages) {
      if (!m.mark_pool) m.mark_pool = std::make_unique<StageMarks>();
      m.marks = m.mark_pool.get();
      m.marks->used = 0;
    }
    m.host_batch = pad > 0 ? nullptr : &b;  // unpadded: the host batch is the device one
    try {
      m.forward(Tp, int(R + (Tp - T)), g ? Tp : int(rows), max_ctx, one_each, out.hidden, out.choices);
    } catch (...) {
      m.marks = nullptr;
      m.host_batch = nullptr;
      throw;
    }
    m.marks = nullptr;
    m.host_batch = nullptr;
    ++m.stats.eager_steps;
  }
  if (late_masks && rows > 0) {  // stream order: after the forward's logits, before every reader of them
    in.await_token_masks();
    m.upload_token_masks(in.token_masks);
    m.apply_token_masks(int(rows));
    argmax_rows_f32(m.s.logits, int(rows), int(m.cfg.vocab), m.s.greedy, m.s.argmax_ws, m.s.argmax_ws_bytes, m.stream);
  }
  if (out.logits && rows > 0) {
    out.logits->resize(size_t(rows * m.cfg.vocab));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(out.logits->data(), m.s.logits, out.logits->size() * 4, cudaMemcpyDeviceToHost,
                                      m.stream));
  }
  if (out.final_hidden) {  // s.h after the final norm (the head gathers from it; nothing writes it after)
    m.h_stage.resize(size_t(T * m.cfg.hidden));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(m.h_stage.data(), m.s.h, m.h_stage.size() * 2, cudaMemcpyDeviceToHost, m.stream));
  }
  if (out.greedy && rows > 0) {
    out.greedy->resize(size_t(rows));
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(out.greedy->data(), m.s.greedy, size_t(rows) * 4, cudaMemcpyDeviceToHost, m.stream));
  }
  if (ns > 0) {
    m.run_sample(sl, m.s.logits + size_t(rows - ns) * size_t(m.cfg.vocab), 0);
    m.read_sampled(sl, 1);
  }
  const StepCounters& c = m.counters;
  const size_t nc = size_t(c.moe_layers * c.experts);
  if (out.expert_counts)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(c.counts_host.p, c.counts.ptr(), nc * 4, cudaMemcpyDeviceToHost, m.stream));
  if (out.device_ms) FP4MOE_CUDA_CHECK(cudaEventRecord(m.ev_end, m.stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  if (out.expert_counts) out.expert_counts->assign(c.counts_host.p, c.counts_host.p + nc);
  if (out.final_hidden) {
    out.final_hidden->resize(m.h_stage.size());
    for (size_t i = 0; i < m.h_stage.size(); ++i) {
      const uint32_t u = uint32_t(m.h_stage[i]) << 16;
      std::memcpy(&(*out.final_hidden)[i], &u, 4);
    }
  }
  if (ns > 0) {
    out.sampled->clear();
    for (int64_t i = 0; i < ns; ++i) out.sampled->push_back(m.sampled_token(sl, 1, 0, i));
  }
  if (out.device_ms) {
    float ms = 0.0f;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, m.ev_begin, m.ev_end));
    *out.device_ms = ms;
  }
  if (out.stages) {
    *out.stages = StageTimes{};
    const StageMarks& k = *m.mark_pool;
    for (size_t i = 0; i + 1 < k.used; ++i) {
      float ms = 0.0f;
      FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, k.events[i], k.events[i + 1]));
      out.stages->ms[int(k.stage[i])] += ms;
    }
  }
}

}  // namespace fp4moe::engine::gpu
