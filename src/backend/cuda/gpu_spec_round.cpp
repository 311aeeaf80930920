// GpuRunner::spec_round_greedy: a greedy speculative round (model/speculative.hpp) as one launch
// sequence on the stream, one upload and one readback.
//
// The host knows every step's batch up front (a greedy request's draft count n is min(N,
// max_new - 1), not data): the draft steps' batches are the host round's (step k: the requests
// with n > k, one token each at start + k - 1, padded to the MTP graph bucket), the verify step is
// decode_rows over [last, d_1 .. d_n] (every row a request of its own, the decode graph of its
// bucket), and the MTP catch-up runs over the same rows. Only tokens (and the catch-up's logits
// rows) are data: every step's metadata is filled on the host (fill_meta) into one pinned block
// with the round's inputs and uploaded in ONE copy; before each step its slice is copied into the
// runner's metadata buffers on the device and copy_indexed_i32 patches in the tokens (drafts, or
// the verify rows' argmax for the catch-up). Hidden states move on the device (BF16 rows in the
// block's hidden buffer between steps, so that poisoned workspaces stay honest).
//
// Bit-equality with the host round (GpuSpecSteps + MtpSpeculator): the draft and verify steps
// are the same batches through the same graphs / kernels, so drafts and verify logits are the
// host round's bit for bit and the emitted tokens (argmax, ties to the lower id, on both paths)
// are the host round's. The catch-up differs in shape (every verify row, decode form, instead of
// the emitted pairs in prefill form): its MTP logits and states can differ in the last bits (the
// GEMMs' row count), which may change a later draft, never an emitted token (a greedy round
// emits the target's choices whatever was drafted).
#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"
#include "backend/decode_rows.hpp"

namespace fp4moe::engine::gpu {
namespace {

uint16_t bf16_bits(float f) {  // round to nearest even, NaN kept a NaN (gpu_mtp.cpp's upload rule)
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// One step of the round as the host builds it (arrays kept alive until the forward is enqueued:
// the eager path plans FlashInfer's prefill from the host batch).
struct RoundStep {
  std::vector<int32_t> tokens, positions, qo, kv_len, page_indptr, pages, rows;
  KvBatchView batch() const {
    return {int64_t(qo.size()) - 1, int64_t(tokens.size()), qo.data(), positions.data(), kv_len.data(),
            page_indptr.data(), pages.data()};
  }
};

}  // namespace

void GpuRunner::Impl::run_spec_round(const SpecRoundInput& in, SpecRoundOutput& out) {
  FP4MOE_CHECK(mtp, "spec round: the runner was loaded without the MTP layer (RunnerOptions::mtp)");
  const int64_t R = int64_t(in.start.size()), N = in.max_drafts, H = cfg.hidden, ps = opt.page_size;
  FP4MOE_CHECK(R >= 1, "spec round: no requests");
  FP4MOE_CHECK(N >= 1, "spec round: {} draft steps (>= 1)", N);
  for (const auto* v : {&in.last_token, &in.first_draft, &in.num_drafts, &in.max_new})
    FP4MOE_CHECK(int64_t(v->size()) == R, "spec round: an array has {} entries for {} requests", v->size(), R);
  FP4MOE_CHECK(int64_t(in.pages.size()) == R, "spec round: pages for {} of {} requests", in.pages.size(), R);
  FP4MOE_CHECK(in.stop_ids.empty() || int64_t(in.stop_ids.size()) == R, "spec round: stop ids for {} of {} requests",
               in.stop_ids.size(), R);
  int64_t stops = 0, longest = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t n = in.num_drafts[size_t(r)];
    FP4MOE_CHECK(in.max_new[size_t(r)] >= 1, "spec round: request {}: max_new {} (>= 1)", r, in.max_new[size_t(r)]);
    FP4MOE_CHECK(n >= 0 && n <= N && n <= in.max_new[size_t(r)] - 1,
                 "spec round: request {}: {} drafts (0 .. min({}, max_new - 1))", r, n, N);
    FP4MOE_CHECK(n == 0 || (in.first_draft[size_t(r)] >= 0 && in.first_draft[size_t(r)] < cfg.vocab),
                 "spec round: request {}: first draft {} outside the vocabulary", r, in.first_draft[size_t(r)]);
    FP4MOE_CHECK(int64_t(in.pages[size_t(r)].size()) * ps >= in.start[size_t(r)] + n + 1,
                 "spec round: request {}: {} pages hold {} positions, the round writes {}", r, in.pages[size_t(r)].size(),
                 int64_t(in.pages[size_t(r)].size()) * ps, in.start[size_t(r)] + n + 1);
    if (!in.stop_ids.empty()) stops = std::max<int64_t>(stops, int64_t(in.stop_ids[size_t(r)].size()));
    longest = std::max<int64_t>(longest, n);
  }
  FP4MOE_CHECK(longest < 2 || in.draft_hidden, "spec round: no draft hidden states for requests that draft twice");

  // The steps: draft steps k = 1 .. longest - 1, the verify step, the catch-up (verify's rows).
  std::vector<RoundStep> steps;
  std::vector<std::vector<int32_t>> who;  // who[k - 1]: requests of draft step k
  for (int64_t k = 1; k < longest; ++k) {
    RoundStep st;
    std::vector<int32_t> w;
    st.qo.push_back(0);
    st.page_indptr.push_back(0);
    for (int64_t r = 0; r < R; ++r) {
      if (in.num_drafts[size_t(r)] <= k) continue;
      w.push_back(int32_t(r));
      st.tokens.push_back(0);  // d_k: patched on the device
      st.positions.push_back(in.start[size_t(r)] + int32_t(k) - 1);
      st.qo.push_back(int32_t(st.tokens.size()));
      st.kv_len.push_back(in.start[size_t(r)] + int32_t(k));
      st.pages.insert(st.pages.end(), in.pages[size_t(r)].begin(), in.pages[size_t(r)].end());
      st.page_indptr.push_back(int32_t(st.pages.size()));
      st.rows.push_back(int32_t(st.tokens.size()) - 1);
    }
    steps.push_back(std::move(st));
    who.push_back(std::move(w));
  }
  const int64_t D = int64_t(steps.size());
  std::vector<int32_t> off(static_cast<size_t>(R)), vsrc;  // verify rows: request r's first; token source (drafts index or -1)
  RoundStep verify;
  {
    RoundStep flat;  // the multi-token batch, then decode_rows over it
    flat.qo.push_back(0);
    flat.page_indptr.push_back(0);
    for (int64_t r = 0; r < R; ++r) {
      const int32_t n = in.num_drafts[size_t(r)];
      off[size_t(r)] = int32_t(flat.tokens.size());
      for (int32_t k = 0; k <= n; ++k) {
        flat.tokens.push_back(k == 0 ? in.last_token[size_t(r)] : 0);
        vsrc.push_back(k == 0 ? -1 : int32_t(r * N + k - 1));
        flat.positions.push_back(in.start[size_t(r)] + k);
      }
      flat.qo.push_back(int32_t(flat.tokens.size()));
      flat.kv_len.push_back(in.start[size_t(r)] + n + 1);
      flat.pages.insert(flat.pages.end(), in.pages[size_t(r)].begin(), in.pages[size_t(r)].end());
      flat.page_indptr.push_back(int32_t(flat.pages.size()));
    }
    const KvBatchView fb = flat.batch();
    const DecodeRows d = decode_rows(fb, ps);
    const KvBatchView v = d.view(fb);
    verify.tokens = flat.tokens;
    verify.positions = flat.positions;
    verify.qo.assign(v.qo_indptr, v.qo_indptr + v.num_requests + 1);
    verify.kv_len.assign(v.kv_len, v.kv_len + v.num_requests);
    verify.page_indptr.assign(v.page_indptr, v.page_indptr + v.num_requests + 1);
    verify.pages.assign(v.page_indices, v.page_indices + v.page_indptr[v.num_requests]);
    for (int32_t i = 0; i < int32_t(flat.tokens.size()); ++i) verify.rows.push_back(i);
  }
  const int64_t Tv = int64_t(verify.tokens.size());
  RoundStep catchup = verify;  // tokens: the verify rows' argmax; logits rows: each request's last emitted
  catchup.rows.assign(size_t(R), 0);
  for (int64_t r = 0; r < R; ++r) catchup.rows[size_t(r)] = int32_t(r);  // placeholders, patched

  // Graph buckets (draft steps and catch-up: the MTP layer's; verify: the decode graphs).
  auto mtp_bucket = [&](int64_t T) -> const GraphEntry* {
    auto it = mtp_graphs.lower_bound(T);
    return it == mtp_graphs.end() ? nullptr : &it->second;
  };
  std::vector<const GraphEntry*> graph(static_cast<size_t>(D + 2));
  for (int64_t k = 0; k < D; ++k) graph[size_t(k)] = mtp_bucket(int64_t(steps[size_t(k)].tokens.size()));
  graph[size_t(D)] = decode_graph(Tv);
  graph[size_t(D + 1)] = mtp_bucket(Tv);
  auto padded = [&](int64_t i, int64_t T) { return graph[size_t(i)] ? std::max(T, graph[size_t(i)]->bucket) : T; };
  FP4MOE_CHECK(padded(D, Tv) <= logits_rows && padded(D + 1, Tv) <= logits_rows,
               "spec round: {} verify rows; the runner was planned for {} logits rows", Tv, logits_rows);

  // The block (int32 units): metas [D + 2] | drafts [R·N] | token sources | draft scatter | hidden
  // gathers | accept inputs | target [Tv] | outputs: out [R·(N+1)], count, accepted, last_row,
  // next_draft [R], next_hidden [R, H] BF16 | hidden rows [Tmax, H] BF16.
  const int64_t MI = int64_t(meta.ints);
  int64_t Tmax = Tv;
  for (int64_t k = 0; k < D; ++k) Tmax = std::max(Tmax, padded(k, int64_t(steps[size_t(k)].tokens.size())));
  Tmax = std::max({Tmax, padded(D + 1, Tv)});
  int64_t at = 0;
  auto take = [&](int64_t ints) {
    const int64_t o = at;
    at += (ints + 3) / 4 * 4;  // 16-byte aligned pieces
    return o;
  };
  const int64_t o_meta = take(MI * (D + 2)), o_drafts = take(R * N);
  std::vector<int64_t> o_src(static_cast<size_t>(D)), o_dst(static_cast<size_t>(D)), o_prev(static_cast<size_t>(D));
  for (int64_t k = 0; k < D; ++k) {
    const int64_t T = int64_t(steps[size_t(k)].tokens.size());
    o_src[size_t(k)] = take(T);
    o_dst[size_t(k)] = take(T);
    o_prev[size_t(k)] = take(T);
  }
  const int64_t o_vsrc = take(Tv), o_n = take(R), o_off = take(R), o_max = take(R), o_stop = take(R * std::max<int64_t>(stops, 1)),
                o_target = take(Tv);
  const int64_t o_out = take(R * (N + 1)), o_count = take(R), o_acc = take(R), o_last = take(R), o_next = take(R),
                o_nh = take(R * H / 2 + 1), out_end = at;
  const int64_t o_hid = take(Tmax * H / 2 + 1), ints = at;
  if (round_host.n < size_t(ints)) round_host.alloc(size_t(ints));
  if (round_dev.bytes() < size_t(ints) * 4) round_dev = cuda::DeviceBuffer(size_t(ints) * 4);
  int32_t* hb = round_host.p;
  int32_t* db = round_dev.as<int32_t>();

  // Host side: every step's metadata (fill_meta validates each batch), the indices, the inputs.
  clear_token_masks();  // a greedy round is unconstrained
  auto stage = [&](int64_t i, const RoundStep& st) {
    StepInput si;
    si.tokens = st.tokens.data();
    si.batch = st.batch();
    si.logits_rows = st.rows;
    fill_meta(si, graph[size_t(i)] ? graph[size_t(i)]->bucket : 0);
    std::memcpy(hb + o_meta + i * MI, meta_host, size_t(MI) * 4);
  };
  for (int64_t k = 0; k < D; ++k) stage(k, steps[size_t(k)]);
  stage(D, verify);
  stage(D + 1, catchup);
  std::fill(hb + o_drafts, hb + o_drafts + R * N, -1);
  for (int64_t r = 0; r < R; ++r)
    if (in.num_drafts[size_t(r)] > 0) hb[o_drafts + r * N] = in.first_draft[size_t(r)];
  for (int64_t k = 0; k < D; ++k) {
    const std::vector<int32_t>& w = who[size_t(k)];
    for (size_t i = 0; i < w.size(); ++i) {
      hb[o_src[size_t(k)] + int64_t(i)] = int32_t(w[i] * N + k);       // input d_{k} (0-based k)
      hb[o_dst[size_t(k)] + int64_t(i)] = int32_t(w[i] * N + k + 1);   // output d_{k+1}
      // Its row in the previous draft step (k > 0): the MTP state the next input reads.
      if (k > 0) {
        const std::vector<int32_t>& p = who[size_t(k - 1)];
        hb[o_prev[size_t(k)] + int64_t(i)] = int32_t(std::find(p.begin(), p.end(), w[i]) - p.begin());
      }
    }
  }
  std::copy(vsrc.begin(), vsrc.end(), hb + o_vsrc);
  std::copy(in.num_drafts.begin(), in.num_drafts.end(), hb + o_n);
  std::copy(off.begin(), off.end(), hb + o_off);
  std::copy(in.max_new.begin(), in.max_new.end(), hb + o_max);
  std::fill(hb + o_stop, hb + o_stop + R * std::max<int64_t>(stops, 1), -1);
  for (int64_t r = 0; r < R && !in.stop_ids.empty(); ++r)
    std::copy(in.stop_ids[size_t(r)].begin(), in.stop_ids[size_t(r)].end(), hb + o_stop + r * stops);
  // Draft step 1's input states: the MTP state of its requests (BF16), zero padding rows.
  auto* hid_host = reinterpret_cast<uint16_t*>(hb + o_hid);
  int64_t up_end = o_hid;  // the upload covers the hidden rows only when a draft step reads them
  if (D > 0) {
    const int64_t T1 = int64_t(who[0].size()), Tp1 = padded(0, T1);
    std::fill(hid_host, hid_host + Tp1 * H, uint16_t(0));
    for (int64_t i = 0; i < T1; ++i)
      for (int64_t j = 0; j < H; ++j) hid_host[i * H + j] = bf16_bits(in.draft_hidden[int64_t(who[0][size_t(i)]) * H + j]);
    up_end = o_hid + (Tp1 * H + 1) / 2;
  }
  FP4MOE_CUDA_CHECK(cudaEventRecord(ev_begin, stream));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(db, hb, size_t(up_end) * 4, cudaMemcpyHostToDevice, stream));

  uint16_t* hid = reinterpret_cast<uint16_t*>(db + o_hid);
  auto load_meta = [&](int64_t i) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(meta_dev.ptr(), db + o_meta + i * MI, size_t(MI) * 4, cudaMemcpyDeviceToDevice,
                                      stream));
  };
  auto hidden_in = [&](int64_t rows) {  // the step's input states (the MTP layer reads them from s.o)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.o, hid, size_t(rows * H) * 2, cudaMemcpyDeviceToDevice, stream));
  };
  // The forward of step i (one token per request everywhere: draft steps, decode rows).
  auto run = [&](int64_t i, const RoundStep& st, bool target, int rows) {
    const GraphEntry* g = graph[size_t(i)];
    const int64_t T = int64_t(st.tokens.size()), Tp = padded(i, T);
    if (g && graphs_enabled) {
      FP4MOE_CUDA_CHECK(cudaGraphLaunch(g->exec, stream));
      ++stats.graph_steps;
      return;
    }
    int max_ctx = 1;
    for (int32_t p : st.positions) max_ctx = std::max(max_ctx, p + 1);
    if (g) max_ctx = int(opt.max_context);  // as captured
    const KvBatchView b = st.batch();
    host_batch = g ? nullptr : &b;  // unpadded: the host batch is the device one
    try {
      if (target)
        forward(int(Tp), int(Tp), g ? int(Tp) : rows, max_ctx, true, nullptr);
      else
        forward_mtp(int(Tp), int(Tp), g ? int(Tp) : rows, max_ctx, true);
    } catch (...) {
      host_batch = nullptr;
      throw;
    }
    host_batch = nullptr;
    ++stats.eager_steps;
  };
  using cuda::step::copy_indexed_i32;
  // 1. Draft steps: input d_k and the previous step's MTP state (hid, zero padding rows), output
  //    d_{k+1} into the drafts and its state gathered into hid for the next step.
  for (int64_t k = 0; k < D; ++k) {
    const RoundStep& st = steps[size_t(k)];
    const int64_t T = int64_t(st.tokens.size());
    poison_activations();
    load_meta(k);
    copy_indexed_i32(meta.tokens, nullptr, db + o_drafts, db + o_src[size_t(k)], int32_t(T), stream);
    hidden_in(padded(k, T));
    run(k, st, false, int(T));
    copy_indexed_i32(db + o_drafts, db + o_dst[size_t(k)], s.greedy, nullptr, int32_t(T), stream);
    if (k + 1 < D) {
      const int64_t T1 = int64_t(steps[size_t(k + 1)].tokens.size());
      FP4MOE_CUDA_CHECK(cudaMemsetAsync(hid, 0, size_t(padded(k + 1, T1) * H) * 2, stream));
      gather_rows(s.h, int(H), db + o_prev[size_t(k + 1)], int(T1), hid, stream);
    }
  }
  // 2. Verify: [last, d_1 .. d_n] of every request as decode rows; the argmax of every row kept.
  poison_activations();
  load_meta(D);
  copy_indexed_i32(meta.tokens, nullptr, db + o_drafts, db + o_vsrc, int32_t(Tv), stream);
  run(D, verify, true, int(Tv));
  copy_indexed_i32(db + o_target, nullptr, s.greedy, nullptr, int32_t(Tv), stream);
  // 3. Accept (the shared rule), the stop ids / max_new cut inside it.
  cpu::SpecAcceptArgs a;
  a.requests = int32_t(R);
  a.max_drafts = int32_t(N);
  a.stop_stride = int32_t(stops);
  a.drafts = db + o_drafts;
  a.num_drafts = db + o_n;
  a.verify_offset = db + o_off;
  a.target = db + o_target;
  a.max_new = db + o_max;
  a.stop_ids = db + o_stop;
  a.out = db + o_out;
  a.count = db + o_count;
  a.accepted = db + o_acc;
  a.last_row = db + o_last;
  cuda::step::spec_accept_greedy(a, stream);
  // 4. The MTP catch-up over every verify row: token of row j = the target's choice there (the
  //    emitted token for j < count), state = the verify row's final hidden state; the logits row
  //    of request r is its last emitted pair's (last_row), the next round's draft source.
  const int64_t Tpc = padded(D + 1, Tv);
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(hid, 0, size_t(Tpc * H) * 2, stream));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(hid, s.h, size_t(Tv * H) * 2, cudaMemcpyDeviceToDevice, stream));
  poison_activations();
  load_meta(D + 1);
  copy_indexed_i32(meta.tokens, nullptr, db + o_target, nullptr, int32_t(Tv), stream);
  copy_indexed_i32(meta.rows, nullptr, db + o_last, nullptr, int32_t(R), stream);
  hidden_in(Tpc);
  run(D + 1, catchup, false, int(R));
  copy_indexed_i32(db + o_next, nullptr, s.greedy, nullptr, int32_t(R), stream);
  auto* nh = reinterpret_cast<uint16_t*>(db + o_nh);
  gather_rows(s.h, int(H), db + o_last, int(R), nh, stream);
  // 5. ONE readback: tokens, counts, accepted, last rows, next drafts, next states.
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(hb + o_out, db + o_out, size_t(out_end - o_out) * 4, cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaEventRecord(ev_end, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  float ms = 0.0f;
  FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_begin, ev_end));
  out.device_ms = ms;
  out.tokens.assign(hb + o_out, hb + o_out + R * (N + 1));
  out.count.assign(hb + o_count, hb + o_count + R);
  out.accepted.assign(hb + o_acc, hb + o_acc + R);
  out.next_draft.assign(hb + o_next, hb + o_next + R);
  out.next_hidden.resize(size_t(R * H));
  const auto* nhh = reinterpret_cast<const uint16_t*>(hb + o_nh);
  for (int64_t i = 0; i < R * H; ++i) {
    const uint32_t u = uint32_t(nhh[i]) << 16;
    std::memcpy(&out.next_hidden[size_t(i)], &u, 4);
  }
}

void GpuRunner::spec_round_greedy(const SpecRoundInput& in, SpecRoundOutput& out) {
  try {
    impl_->run_spec_round(in, out);
  } catch (const cuda::OutOfMemory&) {
    impl_->rethrow_out_of_memory("running a speculative round");
  }
}

}  // namespace fp4moe::engine::gpu
