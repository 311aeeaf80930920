// MtpSpeculator's device round (SpecSteps::greedy_round) on the CPU: a twin of the GPU runner's
// spec_round_greedy (backend/cuda/gpu_spec_round.cpp) over the CPU model's steps — the same
// batches (draft step k over the requests with n > k, the states of the previous step's rows;
// verify over [last, d_1 .. d_n]; the MTP catch-up over EVERY verify row with the target's
// choices as tokens, logits of each request's last emitted row), argmax on the "device", the
// acceptance by core/spec_accept.hpp (the kernel's rule) — checks the speculator's side of it:
// which batches take the device round, the MTP state it leaves (draft token + state instead of
// logits), mixing with host rounds, and that the output is the host round's token for token
// (make-synthetic glm5-tiny, F32 KV): several requests with different prompt lengths, N = 1, 3,
// a stop id inside an accepted run, max_new inside a round, a mixed batch (one sampled request:
// every round on the host, the same tokens as a run without device rounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "../cli/cli_run_helpers.hpp"
#include "core/spec_accept.hpp"
#include "model/kv_pool.hpp"
#include "model/model.hpp"
#include "model/speculative.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_cli;

namespace {

const std::string& tiny_dir() {
  static TempDir t("speculative_device_round_models");
  static const std::string dir = [] {
    const auto d = t.path / "glm5-tiny";
    const Result r = run_binary(t.path, "make-synthetic " + d.string() + " --preset glm5-tiny");
    EXPECT_EQ(r.rc, 0) << r.err;
    return d.string();
  }();
  return dir;
}

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
  bool greedy_round(const model::GreedyRoundInput& in, model::GreedyRoundOutput& out) override {
    const int64_t R = int64_t(in.start.size()), N = in.max_drafts, H = config().hidden, V = config().vocab;
    std::vector<int32_t> drafts(static_cast<size_t>(R * N), -1);
    int32_t longest = 0;
    for (int64_t r = 0; r < R; ++r) {
      if (in.num_drafts[size_t(r)] > 0) drafts[size_t(r * N)] = in.first_draft[size_t(r)];
      longest = std::max(longest, in.num_drafts[size_t(r)]);
    }
    std::vector<int32_t> prev;  // requests of the previous draft step
    std::vector<float> prev_h;  // their MTP states
    for (int32_t k = 1; k < longest; ++k) {
      std::vector<int32_t> who, tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows;
      std::vector<float> hin;
      for (int64_t r = 0; r < R; ++r) {
        if (in.num_drafts[size_t(r)] <= k) continue;
        who.push_back(int32_t(r));
        tokens.push_back(drafts[size_t(r * N + k - 1)]);
        pos.push_back(in.start[size_t(r)] + k - 1);
        qo.push_back(int32_t(tokens.size()));
        kv_len.push_back(in.start[size_t(r)] + k);
        pages.insert(pages.end(), in.pages[size_t(r)].begin(), in.pages[size_t(r)].end());
        page_ptr.push_back(int32_t(pages.size()));
        rows.push_back(int32_t(tokens.size()) - 1);
        const float* h = in.draft_hidden + r * H;
        if (k > 1) h = prev_h.data() + (std::find(prev.begin(), prev.end(), int32_t(r)) - prev.begin()) * H;
        hin.insert(hin.end(), h, h + H);
      }
      const int64_t T = int64_t(tokens.size());
      std::vector<float> logits(static_cast<size_t>(T * V)), hout(static_cast<size_t>(T * H));
      const KvBatchView b{T, T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
      mtp(TensorView::of(tokens.data(), {T}), hin.data(), b, rows, TensorView::of(logits.data(), {T, V}), hout.data());
      for (int64_t i = 0; i < T; ++i) drafts[size_t(who[size_t(i)] * N + k)] = argmax(logits.data() + i * V, V);
      prev = who;
      prev_h = hout;
    }
    // Verify.
    std::vector<int32_t> tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows, off;
    for (int64_t r = 0; r < R; ++r) {
      const int32_t n = in.num_drafts[size_t(r)];
      off.push_back(int32_t(tokens.size()));
      for (int32_t k = 0; k <= n; ++k) {
        tokens.push_back(k == 0 ? in.last_token[size_t(r)] : drafts[size_t(r * N + k - 1)]);
        pos.push_back(in.start[size_t(r)] + k);
        rows.push_back(int32_t(tokens.size()) - 1);
      }
      qo.push_back(int32_t(tokens.size()));
      kv_len.push_back(in.start[size_t(r)] + n + 1);
      pages.insert(pages.end(), in.pages[size_t(r)].begin(), in.pages[size_t(r)].end());
      page_ptr.push_back(int32_t(pages.size()));
    }
    const int64_t T = int64_t(tokens.size());
    std::vector<float> logits(static_cast<size_t>(T * V)), hidden(static_cast<size_t>(T * H));
    const KvBatchView vb{R, T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    verify(TensorView::of(tokens.data(), {T}), vb, rows, TensorView::of(logits.data(), {T, V}), hidden.data());
    std::vector<int32_t> target(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) target[size_t(i)] = argmax(logits.data() + i * V, V);
    // Accept (the kernel's rule).
    int64_t stops = 0;
    for (const auto& s : in.stop_ids) stops = std::max<int64_t>(stops, int64_t(s.size()));
    std::vector<int32_t> stop_ids(static_cast<size_t>(R * std::max<int64_t>(stops, 1)), -1);
    for (int64_t r = 0; r < R; ++r) std::copy(in.stop_ids[size_t(r)].begin(), in.stop_ids[size_t(r)].end(), stop_ids.begin() + r * stops);
    out.tokens.assign(static_cast<size_t>(R * (N + 1)), -2);
    out.count.assign(size_t(R), 0);
    out.accepted.assign(size_t(R), 0);
    std::vector<int32_t> last(static_cast<size_t>(R));
    cpu::SpecAcceptArgs a;
    a.requests = int32_t(R);
    a.max_drafts = int32_t(N);
    a.stop_stride = int32_t(stops);
    a.drafts = drafts.data();
    a.num_drafts = in.num_drafts.data();
    a.verify_offset = off.data();
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
    mtp(TensorView::of(target.data(), {T}), hidden.data(), vb, last, TensorView::of(mlogits.data(), {R, V}), mh.data());
    out.next_draft.resize(size_t(R));
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
