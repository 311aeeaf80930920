// The device speculative round's plan (backend/spec_round_plan.hpp): its batches and index arrays
// for a hand-made round, its refusals; then MtpSpeculator's device round (SpecSteps::greedy_round)
// on the CPU: a twin of the GPU runner's spec_round_greedy (backend/cuda/gpu_spec_round.cpp) that
// runs the SAME plan over the CPU model's steps (draft steps over the plan's batches, tokens and
// states moved by its src / dst / prev indices; verify over its decode rows; the MTP catch-up
// over every verify row with the target's choices as tokens, logits of each request's last
// emitted row), argmax on the "device", the acceptance by core/spec_accept.hpp (the kernel's
// rule) — which checks the plan's index arithmetic and the speculator's side of it:
// which batches take the device round, the MTP state it leaves (draft token + state instead of
// logits), mixing with host rounds, and that the output is the host round's token for token
// (make-synthetic glm5-tiny, F32 KV): several requests with different prompt lengths, N = 1, 3,
// a stop id inside an accepted run, max_new inside a round, a mixed batch (one sampled request:
// every round on the host, the same tokens as a run without device rounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "../cli/cli_run_helpers.hpp"
#include "backend/decode_rows.hpp"
#include "backend/spec_round_plan.hpp"
#include "core/error.hpp"
#include "core/spec_accept.hpp"
#include "model/kv_pool.hpp"
#include "model/model.hpp"
#include "model/speculative.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_cli;

namespace {

const std::string& tiny_dir() { return synthetic_model("speculative_device_round_models", "glm5-tiny"); }

model::Model& tiny() {
  static std::unique_ptr<model::Model> m = [] {
    model::ModelOptions o;
    o.threads = 1;
    return model::Model::load(tiny_dir(), o);
  }();
  return *m;
}

int32_t argmax(const float* row, int64_t V) {  // ties to the lower id (the device's argmax_rows_f32)
  return int32_t(std::max_element(row, row + V) - row);
}

// The device round's twin over the CPU model's steps.
class TwinDeviceSteps final : public model::SpecSteps {
 public:
  TwinDeviceSteps(model::Model& m, model::HostKvPool& kv) : inner_(m, kv) {}
  const model::MlaModelConfig& config() const override { return inner_.config(); }
  int64_t page_size() const override { return inner_.page_size(); }
  void verify(const TensorView& t, const KvBatchView& b, const std::vector<int32_t>& rows, const TensorView& l,
              float* h) override {
    inner_.verify(t, b, rows, l, h);
  }
  void mtp(const TensorView& t, const float* h_in, const KvBatchView& b, const std::vector<int32_t>& rows,
           const TensorView& l, float* h_out) override {
    inner_.mtp(t, h_in, b, rows, l, h_out);
  }
  int64_t rounds = 0;

  bool offers_greedy_round() const override { return true; }
  // The host round's catch-up in the device round's form (GpuSpecSteps' rule), over decode rows.
  bool offers_catchup_over_verify_rows() const override { return true; }
  bool catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                const TensorView& logits, float* h_out) override {
    const engine::DecodeRows d = engine::decode_rows(b, page_size());
    std::vector<int32_t> rows(static_cast<size_t>(b.num_tokens));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(i);
    mtp(tokens, h_in, d.view(b), rows, logits, h_out);
    ++catchups;
    return true;
  }
  int64_t catchups = 0;
  bool greedy_round(const model::GreedyRoundInput& in, model::GreedyRoundOutput& out) override {
    const int64_t H = config().hidden, V = config().vocab;
    const engine::SpecRoundPlan plan = engine::plan_spec_round(in, page_size(), V);
    const int64_t R = plan.requests, N = plan.max_drafts;
    std::vector<int32_t> drafts = plan.drafts_init;
    std::vector<float> prev_h;  // the previous draft step's output states
    for (size_t k = 0; k < plan.drafts.size(); ++k) {
      const engine::SpecRoundStep& st = plan.drafts[k];
      const int64_t T = int64_t(st.tokens.size());
      std::vector<int32_t> tokens(static_cast<size_t>(T));
      std::vector<float> hin;
      for (int64_t i = 0; i < T; ++i) {
        tokens[size_t(i)] = drafts[size_t(plan.src[k][size_t(i)])];
        const float* h = k == 0 ? in.draft_hidden + int64_t(plan.who[0][size_t(i)]) * H
                                : prev_h.data() + int64_t(plan.prev[k][size_t(i)]) * H;
        hin.insert(hin.end(), h, h + H);
      }
      std::vector<float> logits(static_cast<size_t>(T * V)), hout(static_cast<size_t>(T * H));
      mtp(TensorView::of(tokens.data(), {T}), hin.data(), st.batch(), st.rows, TensorView::of(logits.data(), {T, V}),
          hout.data());
      for (int64_t i = 0; i < T; ++i) drafts[size_t(plan.dst[k][size_t(i)])] = argmax(logits.data() + i * V, V);
      prev_h = std::move(hout);
    }
    // Verify over the plan's decode rows.
    std::vector<int32_t> tokens = plan.verify.tokens;
    for (size_t j = 0; j < tokens.size(); ++j)
      if (plan.verify_src[j] >= 0) tokens[j] = drafts[size_t(plan.verify_src[j])];
    const int64_t T = int64_t(tokens.size());
    std::vector<float> logits(static_cast<size_t>(T * V)), hidden(static_cast<size_t>(T * H));
    verify(TensorView::of(tokens.data(), {T}), plan.verify.batch(), plan.verify.rows,
           TensorView::of(logits.data(), {T, V}), hidden.data());
    std::vector<int32_t> target(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) target[size_t(i)] = argmax(logits.data() + i * V, V);
    // Accept (the kernel's rule).
    int64_t stops = 0;
    for (const auto& s : in.stop_ids) stops = std::max<int64_t>(stops, int64_t(s.size()));
    std::vector<int32_t> stop_ids(static_cast<size_t>(R * std::max<int64_t>(stops, 1)), -1);
    for (int64_t r = 0; r < R; ++r)
      std::copy(in.stop_ids[size_t(r)].begin(), in.stop_ids[size_t(r)].end(), stop_ids.begin() + r * stops);
    out.tokens.assign(static_cast<size_t>(R * (N + 1)), -2);
    out.count.assign(static_cast<size_t>(R), 0);
    out.accepted.assign(static_cast<size_t>(R), 0);
    std::vector<int32_t> last(static_cast<size_t>(R));
    cpu::SpecAcceptArgs a;
    a.requests = int32_t(R);
    a.max_drafts = int32_t(N);
    a.stop_stride = int32_t(stops);
    a.drafts = drafts.data();
    a.num_drafts = in.num_drafts.data();
    a.verify_offset = plan.verify_offset.data();
    a.target = target.data();
    a.max_new = in.max_new.data();
    a.stop_ids = stop_ids.data();
    a.out = out.tokens.data();
    a.count = out.count.data();
    a.accepted = out.accepted.data();
    a.last_row = last.data();
    cpu::spec_accept_greedy_cpu(a);
    // The MTP catch-up over every verify row (tokens: the target's choices), logits of the last emitted.
    std::vector<float> mlogits(static_cast<size_t>(R * V)), mh(static_cast<size_t>(T * H));
    mtp(TensorView::of(target.data(), {T}), hidden.data(), plan.catchup.batch(), last,
        TensorView::of(mlogits.data(), {R, V}), mh.data());
    out.next_draft.resize(static_cast<size_t>(R));
    out.next_hidden.resize(static_cast<size_t>(R * H));
    for (int64_t r = 0; r < R; ++r) {
      out.next_draft[size_t(r)] = argmax(mlogits.data() + r * V, V);
      std::copy(mh.begin() + last[size_t(r)] * H, mh.begin() + (last[size_t(r)] + 1) * H, out.next_hidden.begin() + r * H);
    }
    ++rounds;
    return true;
  }

 private:
  model::ModelSpecSteps inner_;
};

struct Req {
  std::vector<int32_t> prompt;
  int32_t max_new = 20;
  std::vector<int32_t> stops;
  cpu::SamplingParams sampling;  // greedy unless set
};

struct DriveResult {
  std::vector<std::vector<int32_t>> tokens;
  int64_t device_rounds = 0, host_rounds = 0, twin_rounds = 0;
  int64_t greedy_batches = 0, mixed_batches = 0;  // rounds whose batch was all device_round_eligible, or not
  int64_t rows_catchups = 0;  // host rounds that caught up over every verify row (the twin's form)
};

// Prefill each request alone (its first token: the argmax), then speculative rounds over the batch
// of running requests until every request is done. twin: the device round's twin (else host rounds);
// alternate: device rounds only every other round (the host round then starts from the MTP state a
// device round left, and the other way round).
DriveResult drive(const std::vector<Req>& reqs, int32_t N, bool twin, bool alternate = false) {
  model::Model& m = tiny();
  const int64_t ps = 16, per = 8, V = m.config().vocab, H = m.config().hidden;
  model::HostKvPool kv(m.mtp_kv_geometry(ps, per * int64_t(reqs.size()), KvElem::F32), m.mtp_kv_index_layers());
  TwinDeviceSteps steps(m, kv);
  std::unique_ptr<model::MtpSpeculator> spec =
      twin ? std::make_unique<model::MtpSpeculator>(steps, N) : std::make_unique<model::MtpSpeculator>(m, kv, N);
  const size_t R = reqs.size();
  std::vector<std::vector<int32_t>> pages(R), gen(R);
  std::vector<bool> done(R, false);
  int64_t greedy_batches = 0, mixed_batches = 0;
  for (size_t r = 0; r < R; ++r) {
    for (int64_t p = 0; p < per; ++p) pages[r].push_back(int32_t(int64_t(r) * per + p));
    const auto& pr = reqs[r].prompt;
    const int32_t P = int32_t(pr.size());
    std::vector<int32_t> pos(pr.size()), qo{0, P}, kvl{P}, pp{0, int32_t(per)};
    for (int32_t i = 0; i < P; ++i) pos[size_t(i)] = i;
    std::vector<float> logits(static_cast<size_t>(V)), hidden(static_cast<size_t>(P * H));
    const KvBatchView b{1, P, qo.data(), pos.data(), kvl.data(), pp.data(), pages[r].data()};
    model::StepExtras x;
    x.final_hidden = hidden.data();
    m.step(TensorView::of(pr.data(), {P}), b, kv, {P - 1}, TensorView::of(logits.data(), {1, V}), nullptr, x);
    const int32_t t0 = cpu::sample_cpu(logits.data(), V, reqs[r].sampling, pr, {}, 0).token;
    gen[r].push_back(t0);
    done[r] = reqs[r].max_new == 1 || std::count(reqs[r].stops.begin(), reqs[r].stops.end(), t0) > 0;
    spec->add_target_rows(uint64_t(r + 1), 0, pr, hidden.data(), t0, pages[r]);
  }
  spec->run_queued();
  for (int guard = 0; guard < 200; ++guard) {
    std::vector<model::SpecRequest> batch;
    std::vector<size_t> who;
    for (size_t r = 0; r < R; ++r) {
      if (done[r]) continue;
      model::SpecRequest q;
      q.id = uint64_t(r + 1);
      q.start = int32_t(reqs[r].prompt.size() + gen[r].size()) - 1;
      q.last_token = gen[r].back();
      q.pages = pages[r];
      q.max_new = reqs[r].max_new - int32_t(gen[r].size());
      q.stop_ids = reqs[r].stops;
      q.sampling = reqs[r].sampling;
      q.prompt = reqs[r].prompt;
      q.generated = gen[r];
      q.output_index = gen[r].size();
      batch.push_back(std::move(q));
      who.push_back(r);
    }
    if (batch.empty()) break;
    if (alternate) spec->device_rounds = guard % 2 == 0;
    const bool all = std::all_of(batch.begin(), batch.end(), [](const model::SpecRequest& q) {
      return model::device_round_eligible(q);
    });
    (all ? greedy_batches : mixed_batches) += 1;
    const auto res = spec->round(batch);
    for (size_t i = 0; i < who.size(); ++i) {
      const size_t r = who[i];
      for (const auto& t : res[i].tokens) {
        gen[r].push_back(t.token);
        if (std::count(reqs[r].stops.begin(), reqs[r].stops.end(), t.token) > 0) done[r] = true;
      }
      if (int32_t(gen[r].size()) >= reqs[r].max_new) done[r] = true;
    }
  }
  DriveResult run;
  run.tokens = gen;
  run.device_rounds = spec->device_round_count;
  run.host_rounds = spec->host_round_count;
  run.twin_rounds = steps.rounds;
  run.rows_catchups = steps.catchups;
  run.greedy_batches = greedy_batches;
  run.mixed_batches = mixed_batches;
  return run;
}

std::vector<int32_t> prompt_of(int64_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((7 + 37 * i + 101 * salt) % 1024));
  return p;
}

cpu::SamplingParams greedy() {
  cpu::SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<Req> three_requests() {
  std::vector<Req> r(3);
  r[0].prompt = prompt_of(5, 1);
  r[1].prompt = prompt_of(33, 2);
  r[2].prompt = prompt_of(12, 3);
  r[1].max_new = 13;
  for (auto& q : r) q.sampling = greedy();
  return r;
}

}  // namespace

// Three requests, N = 3: request 0 drafts 3, request 1 none, request 2 two.
TEST(SpecRoundPlan, BatchesAndIndicesOfAHandMadeRound) {
  model::GreedyRoundInput in;
  in.max_drafts = 3;
  in.start = {20, 5, 40};
  in.last_token = {100, 101, 102};
  in.first_draft = {7, -1, 9};
  in.num_drafts = {3, 0, 2};
  in.max_new = {10, 1, 3};
  in.pages = {{0, 1}, {2}, {3, 4, 5}};
  in.stop_ids = {{}, {}, {}};
  const std::vector<float> h(3 * 4, 0.0f);
  in.draft_hidden = h.data();
  const engine::SpecRoundPlan p = engine::plan_spec_round(in, 16, 1000);
  EXPECT_EQ(p.drafts_init, (std::vector<int32_t>{7, -1, -1, -1, -1, -1, 9, -1, -1}));
  ASSERT_EQ(p.drafts.size(), 2u);  // d_2 of requests 0 and 2, d_3 of request 0
  EXPECT_EQ(p.who[0], (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(p.src[0], (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(p.dst[0], (std::vector<int32_t>{1, 7}));
  EXPECT_EQ(p.drafts[0].positions, (std::vector<int32_t>{20, 40}));
  EXPECT_EQ(p.drafts[0].kv_len, (std::vector<int32_t>{21, 41}));
  EXPECT_EQ(p.drafts[0].pages, (std::vector<int32_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(p.who[1], (std::vector<int32_t>{0}));
  EXPECT_EQ(p.src[1], (std::vector<int32_t>{1}));
  EXPECT_EQ(p.dst[1], (std::vector<int32_t>{2}));
  EXPECT_EQ(p.prev[1], (std::vector<int32_t>{0}));
  EXPECT_EQ(p.drafts[1].positions, (std::vector<int32_t>{21}));
  EXPECT_EQ(p.verify_offset, (std::vector<int32_t>{0, 4, 5}));
  EXPECT_EQ(p.verify.tokens, (std::vector<int32_t>{100, 0, 0, 0, 101, 102, 0, 0}));
  EXPECT_EQ(p.verify_src, (std::vector<int32_t>{-1, 0, 1, 2, -1, -1, 6, 7}));
  EXPECT_EQ(p.verify.positions, (std::vector<int32_t>{20, 21, 22, 23, 5, 40, 41, 42}));
  EXPECT_EQ(p.verify.kv_len, (std::vector<int32_t>{21, 22, 23, 24, 6, 41, 42, 43}));
  EXPECT_EQ(p.verify.qo, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));  // decode rows
  EXPECT_EQ(p.verify.page_indptr, (std::vector<int32_t>{0, 2, 4, 6, 8, 9, 12, 15, 18}));
  EXPECT_EQ(p.catchup.positions, p.verify.positions);
  EXPECT_EQ(p.catchup.rows, p.verify.rows);
}

// GLM-5's serving shape (B 64, N 3, context ~4K on 64-token pages): the plan's sizes, and its host
// time printed (the round's host work before its one upload; info only).
TEST(SpecRoundPlan, AServingSizedRound) {
  const int64_t B = 64, N = 3, ps = 64, start = 4000, pages = (start + N + 1 + ps - 1) / ps;
  model::GreedyRoundInput in;
  in.max_drafts = int32_t(N);
  for (int64_t r = 0; r < B; ++r) {
    in.start.push_back(int32_t(start));
    in.last_token.push_back(int32_t(r));
    in.first_draft.push_back(int32_t(r + 1));
    in.num_drafts.push_back(int32_t(N));
    in.max_new.push_back(100);
    std::vector<int32_t> pt;
    for (int64_t p = 0; p < pages; ++p) pt.push_back(int32_t(r * pages + p));
    in.pages.push_back(pt);
    in.stop_ids.push_back({1, 2});
  }
  const std::vector<float> h(static_cast<size_t>(B * 16), 0.0f);
  in.draft_hidden = h.data();
  const auto t0 = std::chrono::steady_clock::now();
  const int iters = 20;
  engine::SpecRoundPlan p;
  for (int i = 0; i < iters; ++i) p = engine::plan_spec_round(in, ps, 1000);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  ASSERT_EQ(p.drafts.size(), size_t(N - 1));
  for (const auto& st : p.drafts) EXPECT_EQ(int64_t(st.tokens.size()), B);
  EXPECT_EQ(int64_t(p.verify.tokens.size()), B * (N + 1));
  EXPECT_EQ(int64_t(p.verify.pages.size()), B * (N + 1) * pages);
  std::printf("[ info ] plan of a B %ld, N %ld round at context %ld: %.1f us on this host\n", long(B), long(N),
              long(start), us);
}

TEST(SpecRoundPlan, ABadRoundIsOneErrorLine) {
  model::GreedyRoundInput in;
  in.max_drafts = 3;
  in.start = {20};
  in.last_token = {100};
  in.first_draft = {7};
  in.num_drafts = {3};
  in.max_new = {4};
  in.pages = {{0, 1}};
  in.stop_ids = {{}};
  const std::vector<float> h(4, 0.0f);
  in.draft_hidden = h.data();
  auto refused = [&](const model::GreedyRoundInput& bad, const char* what) {
    try {
      engine::plan_spec_round(bad, 16, 1000);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
  };
  EXPECT_NO_THROW(engine::plan_spec_round(in, 16, 1000));
  auto b = in;
  b.max_new = {3};  // 3 drafts need max_new >= 4
  refused(b, "drafts");
  b = in;
  b.first_draft = {1000};
  refused(b, "outside the vocabulary");
  b = in;
  b.pages = {{0}};  // 16 positions, the round writes 24
  refused(b, "pages");
  b = in;
  b.draft_hidden = nullptr;
  refused(b, "hidden");
  b = in;
  b.last_token = {};
  refused(b, "entries");
}

TEST(SpeculativeDeviceRound, GreedyBatchesTakeTheDeviceRoundAndEmitTheHostRoundsTokens) {
  for (int32_t N : {1, 3}) {
    const auto reqs = three_requests();
    const DriveResult host = drive(reqs, N, false), dev = drive(reqs, N, true);
    EXPECT_EQ(dev.tokens, host.tokens) << "N " << N;
    EXPECT_GT(dev.device_rounds, 0);
    EXPECT_EQ(dev.host_rounds, 0) << "every batch is greedy";
    EXPECT_EQ(dev.twin_rounds, dev.device_rounds);
    EXPECT_EQ(host.device_rounds, 0);  // the CPU model's steps offer no device round
    for (size_t r = 0; r < reqs.size(); ++r) EXPECT_EQ(int32_t(dev.tokens[r].size()), reqs[r].max_new);
  }
}

TEST(SpeculativeDeviceRound, HostAndDeviceRoundsAlternateOverOneMtpState) {
  const auto reqs = three_requests();
  const DriveResult host = drive(reqs, 3, false), mixed = drive(reqs, 3, true, true);
  EXPECT_EQ(mixed.tokens, host.tokens);
  EXPECT_GT(mixed.device_rounds, 0);
  EXPECT_GT(mixed.host_rounds, 0);
  EXPECT_EQ(mixed.rows_catchups, mixed.host_rounds) << "the twin's host rounds catch up in the device form";
}

TEST(SpeculativeDeviceRound, AStopIdInsideAnAcceptedRunAndMaxNewInsideARoundEndTheRequestThere) {
  auto reqs = three_requests();
  const DriveResult plain = drive(reqs, 3, false);
  // Stop ids: request 0 at its 7th token (inside some round), request 2 at its 4th; max_new of
  // request 1 at 6 (rounds of up to 4 tokens: the second round is cut).
  reqs[0].stops = {plain.tokens[0][6]};
  reqs[2].stops = {plain.tokens[2][3], 1023};
  reqs[1].max_new = 6;
  const DriveResult host = drive(reqs, 3, false), dev = drive(reqs, 3, true);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_GT(dev.device_rounds, 0);
  auto first_stop = [](const std::vector<int32_t>& t, const std::vector<int32_t>& stops) {
    for (size_t i = 0; i < t.size(); ++i)
      if (std::count(stops.begin(), stops.end(), t[i])) return i + 1;
    return t.size();
  };
  EXPECT_EQ(dev.tokens[0].size(), first_stop(plain.tokens[0], reqs[0].stops));
  EXPECT_EQ(dev.tokens[2].size(), first_stop(plain.tokens[2], reqs[2].stops));
  EXPECT_EQ(dev.tokens[1].size(), 6u);
  for (size_t r = 0; r < 3; ++r)  // a prefix of the plain run's
    EXPECT_TRUE(std::equal(dev.tokens[r].begin(), dev.tokens[r].end(), plain.tokens[r].begin())) << "request " << r;
}

TEST(SpeculativeDeviceRound, AMixedBatchRunsOnTheHostWithTheSameTokens) {
  auto reqs = three_requests();
  reqs[1].sampling.temperature = 0.8f;  // sampled: not eligible
  reqs[1].sampling.seed = 42;
  reqs[1].sampling.has_seed = true;
  reqs[0].sampling.repetition_penalty = 1.3f;  // penalties: not eligible either
  reqs[2].sampling.logprobs_top_n = 0;  // logprobs: not eligible either
  const DriveResult host = drive(reqs, 3, false), dev = drive(reqs, 3, true);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_EQ(dev.device_rounds, 0);
  EXPECT_EQ(dev.host_rounds, dev.mixed_batches);

  // Requests 0 and 2 greedy: the batch is mixed while request 1 runs, greedy-only after it
  // finished (or before them): device rounds exactly for the greedy-only batches, host rounds for
  // the rest, over one MTP state, the same tokens.
  reqs[0].sampling.repetition_penalty = 1.0f;
  reqs[2].sampling.logprobs_top_n = -1;
  reqs[0].max_new = 28;
  reqs[1].max_new = 10;
  const DriveResult host2 = drive(reqs, 3, false), dev2 = drive(reqs, 3, true);
  EXPECT_EQ(dev2.tokens, host2.tokens);
  EXPECT_EQ(dev2.device_rounds, dev2.greedy_batches);
  EXPECT_EQ(dev2.host_rounds, dev2.mixed_batches);
  EXPECT_GT(dev2.mixed_batches, 0);
  EXPECT_GT(dev2.greedy_batches, 0) << "request 0 (28 tokens) outlives request 1 (10) by the round counts here";
}
