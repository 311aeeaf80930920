// GpuRunner::spec_round_greedy: a greedy speculative round (model/speculative.hpp) as one launch
// sequence on the stream, one upload and one readback.
//
// The host knows every step's batch up front (a greedy request's draft count n is min(N,
// max_new - 1), not data): backend/spec_round_plan.hpp builds them — the draft steps' batches are
// the host round's (padded to the MTP graph bucket), the verify step is decode_rows over [last,
// d_1 .. d_n] (every row a request of its own, the decode graph of its bucket), and the MTP
// catch-up runs over the same rows. Only tokens (and the catch-up's logits rows) are data: every step's metadata is filled on the host (fill_meta) into one pinned block
// with the round's inputs and uploaded in ONE copy; before each step its slice is copied into the
// runner's metadata buffers on the device and copy_indexed_i32 patches in the tokens (drafts, or
// the verify rows' argmax for the catch-up). Hidden states move on the device (BF16 rows in the
// block's hidden buffer between steps, so that poisoned workspaces stay honest).
// Every forward replays its bucket's graph (or runs eager over the same padded batch); the
// kernels and copies between them are enqueued eagerly, without a host sync. The round is not one
// graph: a graph exec cannot be launched inside a capture (see README "Speculative decoding").
//
// Bit-equality with the host round (GpuSpecSteps + MtpSpeculator): the draft steps, the verify
// step and the catch-up are the host round's batches (its catch-up runs in this form on this
// backend: GpuSpecSteps::catchup_over_verify_rows) through the same graphs / kernels, the argmax
// (ties to the lower id) is the host's rule: drafts, verify logits, emitted tokens and the next
// MTP state are the host round's bit for bit.
#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"
#include "backend/spec_round_plan.hpp"

namespace fp4moe::engine::gpu {
namespace {

uint16_t bf16_bits(float f) {  // round to nearest even, NaN kept a NaN (gpu_mtp.cpp's upload rule)
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace

void GpuRunner::Impl::run_spec_round(const GreedyRoundInput& in, GreedyRoundOutput& out) {
  FP4MOE_CHECK(mtp, "spec round: the runner was loaded without the MTP layer (RunnerOptions::mtp)");
  const SpecRoundPlan plan = plan_spec_round(in, opt.page_size, cfg.vocab);  // validates (one line)
  const int64_t R = plan.requests, N = plan.max_drafts, H = cfg.hidden, D = int64_t(plan.drafts.size());
  int64_t stops = 0;
  for (const auto& ids : in.stop_ids) stops = std::max<int64_t>(stops, int64_t(ids.size()));
  const std::vector<SpecRoundStep>& steps = plan.drafts;
  const SpecRoundStep &verify = plan.verify, &catchup = plan.catchup;
  const int64_t Tv = int64_t(verify.tokens.size());

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
  auto stage = [&](int64_t i, const SpecRoundStep& st) {
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
  std::copy(plan.drafts_init.begin(), plan.drafts_init.end(), hb + o_drafts);
  for (int64_t k = 0; k < D; ++k) {
    std::copy(plan.src[size_t(k)].begin(), plan.src[size_t(k)].end(), hb + o_src[size_t(k)]);
    std::copy(plan.dst[size_t(k)].begin(), plan.dst[size_t(k)].end(), hb + o_dst[size_t(k)]);
    std::copy(plan.prev[size_t(k)].begin(), plan.prev[size_t(k)].end(), hb + o_prev[size_t(k)]);
  }
  std::copy(plan.verify_src.begin(), plan.verify_src.end(), hb + o_vsrc);
  std::copy(in.num_drafts.begin(), in.num_drafts.end(), hb + o_n);
  std::copy(plan.verify_offset.begin(), plan.verify_offset.end(), hb + o_off);
  std::copy(in.max_new.begin(), in.max_new.end(), hb + o_max);
  std::fill(hb + o_stop, hb + o_stop + R * std::max<int64_t>(stops, 1), -1);
  for (int64_t r = 0; r < R && !in.stop_ids.empty(); ++r)
    std::copy(in.stop_ids[size_t(r)].begin(), in.stop_ids[size_t(r)].end(), hb + o_stop + r * stops);
  // Draft step 1's input states: the MTP state of its requests (BF16), zero padding rows.
  auto* hid_host = reinterpret_cast<uint16_t*>(hb + o_hid);
  int64_t up_end = o_hid;  // the upload covers the hidden rows only when a draft step reads them
  if (D > 0) {
    const int64_t T1 = int64_t(plan.who[0].size()), Tp1 = padded(0, T1);
    std::fill(hid_host, hid_host + Tp1 * H, uint16_t(0));
    for (int64_t i = 0; i < T1; ++i)
      for (int64_t j = 0; j < H; ++j) hid_host[i * H + j] = bf16_bits(in.draft_hidden[int64_t(plan.who[0][size_t(i)]) * H + j]);
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
  auto run = [&](int64_t i, const SpecRoundStep& st, bool target, int rows) {
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
    const SpecRoundStep& st = steps[size_t(k)];
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
  //    emitted token for j < count), state = the verify row's final hidden state; logits of
  //    every row (the host round's catch-up form: the same GEMM rows), the first R of them
  //    gathered from each request's last emitted pair (last_row), the next round's draft source.
  const int64_t Tpc = padded(D + 1, Tv);
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(hid, 0, size_t(Tpc * H) * 2, stream));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(hid, s.h, size_t(Tv * H) * 2, cudaMemcpyDeviceToDevice, stream));
  poison_activations();
  load_meta(D + 1);
  copy_indexed_i32(meta.tokens, nullptr, db + o_target, nullptr, int32_t(Tv), stream);
  copy_indexed_i32(meta.rows, nullptr, db + o_last, nullptr, int32_t(R), stream);
  hidden_in(Tpc);
  run(D + 1, catchup, false, int(Tv));
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

void GpuRunner::spec_round_greedy(const GreedyRoundInput& in, GreedyRoundOutput& out) {
  try {
    impl_->run_spec_round(in, out);
  } catch (const cuda::OutOfMemory&) {
    impl_->rethrow_out_of_memory("running a speculative round");
  }
}

}  // namespace fp4moe::engine::gpu
