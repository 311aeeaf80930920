// The host speculative round (MtpSpeculator::round without a device round) over steps whose
// logits cost nothing to compute (spec_host_round_util.hpp's BankSpecSteps):
// - the same rounds (greedy, sampled with top-k / top-p, penalties, logprobs, a grammar-like
//   constraint, mixed in one batch) give the same tokens, logprobs, top lists, drafted and
//   accepted counts with 1 thread and with several, round after round — on random logits at a
//   small vocabulary and through the tiny synthetic model (glm5-tiny: 3 layers + its MTP layer);
// - the sparse distributions equal the dense ones bit for bit; top-k's kept set is a full sort's;
// - DISABLED_ SpecHostRoundTiming.TimeRounds (run with --gtest_also_run_disabled_tests): the
//   per-phase cost of a round at GLM-5's vocabulary (154,880) and hidden size (6,144), B 1 / 8 / 64.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "../cli/cli_run_helpers.hpp"
#include "spec_host_round_util.hpp"

using namespace fp4moe;
using fp4moe::testing_spec::BankSpecSteps;
using fp4moe::testing_spec::Mode;
using fp4moe::testing_spec::RoundDriver;

namespace {

void expect_same(const std::vector<std::vector<model::SpecRoundResult>>& a,
                 const std::vector<std::vector<model::SpecRoundResult>>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what;
    for (size_t r = 0; r < a[i].size(); ++r) {
      const model::SpecRoundResult &x = a[i][r], &y = b[i][r];
      EXPECT_EQ(x.drafted, y.drafted) << what << " round " << i << " request " << r;
      EXPECT_EQ(x.accepted, y.accepted) << what << " round " << i << " request " << r;
      ASSERT_EQ(x.tokens.size(), y.tokens.size()) << what << " round " << i << " request " << r;
      for (size_t k = 0; k < x.tokens.size(); ++k) {
        EXPECT_EQ(x.tokens[k].token, y.tokens[k].token) << what << " round " << i << " request " << r << " k " << k;
        // Bits, not values: a thread count may change nothing.
        EXPECT_EQ(std::memcmp(&x.tokens[k].logprob, &y.tokens[k].logprob, 4), 0) << what << " round " << i;
        EXPECT_EQ(x.tokens[k].top, y.tokens[k].top) << what << " round " << i << " request " << r;
      }
    }
  }
}

}  // namespace

TEST(SpecHostRound, OneThreadAndSeveralGiveTheSameRoundsOnRandomLogits) {
  for (bool agree : {true, false})      // verify rows equal to the drafts' rows (every draft accepted) or not
    for (bool rows_form : {true, false}) {  // the cuda backend's catch-up form or the queued pairs
      std::vector<std::vector<model::SpecRoundResult>> runs[2];
      int64_t accepted = 0, drafted = 0;
      for (int t = 0; t < 2; ++t) {
        // The second run also reads the logits in place (SpecSteps::lends_logits).
        BankSpecSteps steps(/*vocab=*/1000, /*hidden=*/8, agree, rows_form, /*bank=*/37, /*lend=*/t == 1);
        RoundDriver d(steps, /*num_steps=*/3, /*threads=*/t == 0 ? 1 : 4);
        // Every kind of request in one batch, twice over (12 requests).
        for (int i = 0; i < 12; ++i) d.add(Mode(i % 6), /*max_tokens=*/40 + i);
        for (int round = 0; round < 16; ++round) runs[t].push_back(d.round());
        if (t == 1) {
          for (const auto& rr : runs[t])
            for (const auto& x : rr) accepted += x.accepted, drafted += x.drafted;
        }
      }
      expect_same(runs[0], runs[1], agree ? "agreeing rows" : "independent rows");
      EXPECT_GT(drafted, 0);
      if (agree) {
        EXPECT_GT(accepted, drafted / 2) << "the agreeing rows accept most drafts";
      }
    }
}

TEST(SpecHostRound, OneThreadAndSeveralGiveTheSameRoundsOnTheTinyModel) {
  model::ModelOptions o;
  o.threads = 1;
  const auto m = model::Model::load(testing_cli::synthetic_model("spec_host_round_models", "glm5-tiny"), o);
  for (bool rows_form : {true, false}) {
    std::vector<std::vector<model::SpecRoundResult>> runs[2];
    for (int t = 0; t < 2; ++t) {
      const int32_t per = 4, page = 16, nreq = 12;
      model::HostKvPool kv(m->mtp_kv_geometry(page, per * nreq, KvElem::F32), m->mtp_kv_index_layers());
      model::ModelSpecSteps steps(*m, kv, rows_form);
      RoundDriver d(steps, 3, t == 0 ? 1 : 4);
      d.pages_per_request = per;
      for (int i = 0; i < nreq; ++i) d.add(Mode(i % 6), 30 + i);
      for (int round = 0; round < 12; ++round) runs[t].push_back(d.round());
    }
    int64_t drafted = 0, emitted = 0;
    for (const auto& rr : runs[1])
      for (const auto& x : rr) drafted += x.drafted, emitted += int64_t(x.tokens.size());
    EXPECT_GT(drafted, 100);
    EXPECT_GT(emitted, 100);
    expect_same(runs[0], runs[1], rows_form ? "tiny model, catch-up over the verify rows" : "tiny model, queued pairs");
  }
}

// Greedy drafts on rows of ties, NaN, ±0 and ±inf are the target's greedy token on the same row
// (the steps give a position's draft row and verify row the same values, so each draft must
// equal the token emitted at its place; a faster draft choice than sample_cpu must keep this).
TEST(SpecHostRound, GreedyDraftsAreSampleCpusTokenOnRowsOfTiesAndNonFiniteValues) {
  const float vals[] = {-std::numeric_limits<float>::infinity(), -1.0f, -0.0f, 0.0f, 1.0f, std::nanf(""),
                        std::numeric_limits<float>::infinity(), 1.0f};
  int64_t compared = 0;
  for (int trial = 0; trial < 8; ++trial) {
    BankSpecSteps steps(/*vocab=*/64, /*hidden=*/4, /*agree=*/true, /*rows_form=*/true, /*bank=*/5);
    steps.edit_bank([&](float* bank, int64_t n) {
      std::mt19937 rng{uint32_t(trial)};
      for (int64_t i = 0; i < n; ++i) bank[i] = vals[rng() % (trial < 4 ? 8u : 6u)];  // trial >= 4: no +inf
    });
    RoundDriver d(steps, 3, 2);
    d.spec().on_round = [&](const model::RoundTrace& t) {
      for (size_t k = 0; k < std::min(t.drafts.size(), t.emitted.size()); ++k, ++compared)
        EXPECT_EQ(t.drafts[k], t.emitted[k]) << "trial " << trial << ": " << t.describe();
    };
    for (int i = 0; i < 4; ++i) d.add(Mode::kGreedy, 1 << 20);
    for (int round = 0; round < 6; ++round) d.round();
  }
  EXPECT_GT(compared, 20);
}

TEST(SpecHostRound, SparseDistributionsEqualTheDenseOnesBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t V = 300 + trial * 7;
    std::vector<float> row(static_cast<size_t>(V)), row2(static_cast<size_t>(V));
    for (auto& v : row) v = nd(rng);
    for (auto& v : row2) v = nd(rng);
    if (trial % 5 == 1) row[3] = -std::numeric_limits<float>::infinity();
    if (trial % 5 == 2) row[7] = std::nanf("");
    if (trial % 5 == 3) row[11] = std::numeric_limits<float>::infinity();
    cpu::SamplingParams p;
    p.temperature = 0.7f;
    p.top_k = trial % 3 == 0 ? -1 : 50;
    p.top_p = trial % 4 == 0 ? 1.0f : 0.9f;
    p.min_p = trial % 7 == 0 ? 0.05f : 0.0f;
    p.repetition_penalty = trial % 2 ? 1.1f : 1.0f;
    const std::vector<int32_t> prompt{1, 2, 3}, out{4, 5, 4};
    const std::vector<double> dp = cpu::sampling_distribution(row.data(), V, p, prompt, out);
    const std::vector<double> dq = cpu::sampling_distribution(row2.data(), V, p, prompt, out);
    const cpu::SparseDistribution sp = cpu::sampling_distribution_sparse(row.data(), V, p, prompt, out);
    const cpu::SparseDistribution sq = cpu::sampling_distribution_sparse(row2.data(), V, p, prompt, out);
    std::vector<double> back(static_cast<size_t>(V), 0.0);
    for (size_t i = 0; i < sp.ids.size(); ++i) back[size_t(sp.ids[i])] = sp.prob[i];
    ASSERT_EQ(std::memcmp(back.data(), dp.data(), dp.size() * 8), 0) << "trial " << trial;
    for (double u : {0.0, 0.1, 0.5, 0.93, 0.999999}) {
      EXPECT_EQ(model::draw_from(sp, u), model::draw_from(dp, u)) << "trial " << trial << " u " << u;
      for (int32_t d : {int32_t(sq.ids.front()), int32_t(sq.ids.back()), 0, int32_t(V - 1)}) {
        const model::SampledVerdict a = model::verify_sampled(sp, sq, d, u, 1.0 - u);
        const model::SampledVerdict b = model::verify_sampled(dp, dq, d, u, 1.0 - u);
        EXPECT_EQ(a.token, b.token) << "trial " << trial;
        EXPECT_EQ(a.accepted, b.accepted) << "trial " << trial;
      }
    }
  }
}

// top-k's kept set (cpu sampling's truncate, a one-pass heap) against a full sort: the first k by
// x descending, ties to the lower id, on rows full of ties and -inf / NaN (NaN: no mass, as -inf).
TEST(SpecHostRound, TopKKeepsTheFirstKInRankOrderWithTies) {
  std::mt19937 rng(9);
  const float vals[] = {-std::numeric_limits<float>::infinity(), -1.0f, 0.0f, 0.5f, 1.0f, 2.0f, std::nanf("")};
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t V = 50 + trial * 13;
    std::vector<float> row(static_cast<size_t>(V));
    for (auto& v : row) v = vals[rng() % 7];
    row[size_t(trial) % size_t(V)] = 2.0f;  // a finite maximum
    cpu::SamplingParams p;
    p.top_k = 1 + int32_t(rng() % uint32_t(V - 1));
    const cpu::SparseDistribution d = cpu::sampling_distribution_sparse(row.data(), V, p, {}, {});
    std::vector<int32_t> ids(static_cast<size_t>(V));
    for (int32_t i = 0; i < int32_t(V); ++i) ids[size_t(i)] = i;
    auto x = [&](int32_t i) { return std::isnan(row[size_t(i)]) ? -std::numeric_limits<float>::infinity() : row[size_t(i)]; };
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x(a) > x(b); });
    std::vector<int32_t> want(ids.begin(), ids.begin() + p.top_k);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(d.ids, want) << "trial " << trial << " top_k " << p.top_k;
    // sample_cpu's rank margin: the last kept x against the best dropped one (on the row with
    // its NaNs made -1.5: sample_cpu ranks NaN by its order key, not as -inf).
    std::vector<float> finite = row;
    for (float& v : finite) v = std::isnan(v) ? -1.5f : v;
    std::vector<int32_t> by_x(ids);
    std::sort(by_x.begin(), by_x.end());
    std::stable_sort(by_x.begin(), by_x.end(), [&](int32_t a, int32_t b) { return finite[size_t(a)] > finite[size_t(b)]; });
    const cpu::SampledToken t = cpu::sample_cpu(finite.data(), V, p, {}, {}, 0);
    EXPECT_EQ(t.kept, p.top_k) << "trial " << trial;
    const double want_margin = double(finite[size_t(by_x[size_t(p.top_k) - 1])]) - double(finite[size_t(by_x[size_t(p.top_k)])]);
    EXPECT_TRUE(t.rank_margin == want_margin || (std::isnan(t.rank_margin) && std::isnan(want_margin)))  // -inf - -inf
        << "trial " << trial << ": " << t.rank_margin << " vs " << want_margin;
  }
}

// The per-phase cost of a host round at GLM-5's sizes. Prints one line per configuration: ms per
// round of the whole round and of its parts (the fake steps' own time is what the device and its
// read-back cost on the GPU: here a memcpy of bank rows).
TEST(SpecHostRoundTiming, DISABLED_TimeRounds) {
  const int64_t V = 154880, H = 6144;
  const int threads = default_num_threads();
  std::printf("vocab %ld hidden %ld, 3 draft steps, threads %d (FP4MOE_THREADS)\n", long(V), long(H), threads);
  const bool lend = std::getenv("SPEC_LEND") != nullptr;  // SPEC_LEND=1: the steps lend their logits (the GPU form)
  std::printf("logits %s\n", lend ? "lent by the steps (no copy into the round's buffers)" : "copied into the round's buffers");
  for (const char* kind : {"greedy", "sampled", "sampled+grammar", "sampled+penalties+logprobs"})
    for (int B : {1, 8, 64}) {
      BankSpecSteps steps(V, H, /*agree=*/true, /*rows_form=*/true, /*bank=*/16, /*lend=*/lend);
      RoundDriver d(steps, 3, threads);
      d.constraint_end_every = 1 << 30;  // the batch stays whole
      const std::string k = kind;
      const Mode m = k == "greedy" ? Mode::kGreedy
                     : k == "sampled" ? Mode::kSampled
                     : k == "sampled+grammar" ? Mode::kSampledConstrained
                                              : Mode::kSampledPenaltiesLogprobs;
      for (int i = 0; i < B; ++i) d.add(m, 1 << 20);
      d.round();  // the first round only verifies (no MTP state yet)
      d.round();  // warm: the buffers
      const model::MtpSpeculator::Times t0 = d.spec().times;
      const double f0 = steps.fill_seconds;
      const int rounds = B == 64 ? 3 : 6;
      const auto w0 = std::chrono::steady_clock::now();
      int64_t emitted = 0;
      for (int i = 0; i < rounds; ++i)
        for (const auto& x : d.round()) emitted += int64_t(x.tokens.size());
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      const model::MtpSpeculator::Times& t = d.spec().times;
      auto ms = [&](double a, double b) { return 1e3 * (a - b) / rounds; };
      std::printf("%-28s B %2d: round %8.2f ms | draft choose %7.2f  accept %7.2f  catch-up host %6.2f  buffers %6.2f  "
                  "fake steps %6.2f  other %6.2f | %.2f tokens/request/round\n",
                  kind, B, 1e3 * wall / rounds, ms(t.host_draft, t0.host_draft), ms(t.host_accept, t0.host_accept),
                  ms(t.host_catchup, t0.host_catchup), ms(t.host_buffers, t0.host_buffers),
                  ms(steps.fill_seconds, f0),
                  1e3 * wall / rounds - ms(t.host_draft, t0.host_draft) - ms(t.host_accept, t0.host_accept) -
                      ms(t.host_catchup, t0.host_catchup) - ms(t.host_buffers, t0.host_buffers) -
                      ms(steps.fill_seconds, f0),
                  double(emitted) / rounds / B);
      std::fflush(stdout);
    }
}

// A fingerprint of the rounds of OneThreadAndSeveral... (FNV-1a over tokens, logprob bits, top
// lists, drafted and accepted counts): run it before and after a change to the round that must
// not change what is drawn, and compare the lines.
TEST(SpecHostRound, DISABLED_PrintFingerprint) {
  for (bool agree : {true, false})
    for (bool rows_form : {true, false}) {
      BankSpecSteps steps(1000, 8, agree, rows_form, 37);
      RoundDriver d(steps, 3, 1);
      for (int i = 0; i < 12; ++i) d.add(Mode(i % 6), 40 + i);
      uint64_t h = 1469598103934665603ull;
      auto mix = [&](uint64_t v) {
        for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
      };
      int64_t tokens = 0;
      for (int round = 0; round < 16; ++round)
        for (const auto& x : d.round()) {
          mix(uint64_t(x.drafted)), mix(uint64_t(x.accepted));
          for (const auto& t : x.tokens) {
            uint32_t lp;
            std::memcpy(&lp, &t.logprob, 4);
            mix(uint64_t(t.token)), mix(lp), ++tokens;
            for (const auto& [id, l] : t.top) {
              std::memcpy(&lp, &l, 4);
              mix(uint64_t(id)), mix(lp);
            }
          }
        }
      std::printf("agree %d rows_form %d: %ld tokens, fingerprint %016lx\n", int(agree), int(rows_form), long(tokens),
                  (unsigned long)h);
    }
}
