// The greedy acceptance rule of the device speculative round (core/spec_accept.hpp), which the
// cuda/step kernel runs per request (tests/ops checks the kernel against spec_accept_greedy_cpu):
// hand-made rounds (all accepted, a mismatch, no drafts, a stop id inside the accepted run, a
// stop id on the bonus, max_new inside the run) and random rounds against the host round's loop
// (model/speculative.cpp's greedy path, restated here on token ids).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/spec_accept.hpp"

using namespace fp4moe;

namespace {

struct Verdict {
  std::vector<int32_t> tokens;
  int32_t accepted = 0;
  int32_t last_row = 0;
};

// One request of N = drafts.size() at verify offset 3 (rows before it belong to another request).
Verdict accept_one(const std::vector<int32_t>& drafts, const std::vector<int32_t>& target, int32_t max_new,
                   std::vector<int32_t> stops) {
  const int32_t n = int32_t(drafts.size()), N = std::max(n, 1), off = 3;
  std::vector<int32_t> d(static_cast<size_t>(N), -1), t(static_cast<size_t>(off), 999), out(static_cast<size_t>(N + 1), -5);
  std::copy(drafts.begin(), drafts.end(), d.begin());
  t.insert(t.end(), target.begin(), target.end());
  int32_t count = -1, acc = -1, last = -1;
  cpu::SpecAcceptArgs a;
  a.requests = 1;
  a.max_drafts = N;
  a.stop_stride = int32_t(stops.size());
  a.drafts = d.data();
  a.num_drafts = &n;
  a.verify_offset = &off;
  a.target = t.data();
  a.max_new = &max_new;
  a.stop_ids = stops.data();
  a.out = out.data();
  a.count = &count;
  a.accepted = &acc;
  a.last_row = &last;
  cpu::spec_accept_greedy_cpu(a);
  Verdict v;
  v.tokens.assign(out.begin(), out.begin() + count);
  for (int32_t k = count; k <= N; ++k) EXPECT_EQ(out[size_t(k)], -1) << "past the emitted tokens";
  v.accepted = acc;
  v.last_row = last;
  EXPECT_EQ(last, off + count - 1);
  return v;
}

// The host round's greedy acceptance on token ids (model/speculative.cpp: emit the target's choice
// at row k; stop at a mismatch; count the accept; stop when the emitted token ends the request).
Verdict host_round(const std::vector<int32_t>& drafts, const std::vector<int32_t>& target, int32_t max_new,
                   const std::vector<int32_t>& stops) {
  Verdict v;
  const int32_t n = int32_t(drafts.size());
  for (int32_t k = 0; k <= n; ++k) {
    const int32_t t = target[size_t(k)];
    v.tokens.push_back(t);
    const bool end =
        std::find(stops.begin(), stops.end(), t) != stops.end() || int32_t(v.tokens.size()) >= max_new;
    if (!(k < n && t == drafts[size_t(k)])) break;
    ++v.accepted;
    if (end) break;
  }
  return v;
}

}  // namespace

TEST(SpecAccept, AllDraftsAcceptedEmitTheBonusToo) {
  const Verdict v = accept_one({5, 6, 7}, {5, 6, 7, 8}, 10, {});
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(v.accepted, 3);
}

TEST(SpecAccept, AMismatchEndsTheRunWithTheTargetsChoice) {
  const Verdict v = accept_one({5, 6, 7}, {5, 9, 7, 8}, 10, {});
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(v.accepted, 1);
  const Verdict first = accept_one({5, 6, 7}, {4, 6, 7, 8}, 10, {});
  EXPECT_EQ(first.tokens, (std::vector<int32_t>{4}));
  EXPECT_EQ(first.accepted, 0);
}

TEST(SpecAccept, NoDraftsEmitsOneToken) {
  const Verdict v = accept_one({}, {11}, 1, {});
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{11}));
  EXPECT_EQ(v.accepted, 0);
}

TEST(SpecAccept, AStopIdInsideTheAcceptedRunEndsItThere) {
  const Verdict v = accept_one({5, 2, 7}, {5, 2, 7, 8}, 10, {2, -1});
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5, 2}));
  EXPECT_EQ(v.accepted, 2);  // the stop id was a draft, accepted, and ends the request
  const Verdict bonus = accept_one({5, 6}, {5, 6, 2}, 10, {3, 2});
  EXPECT_EQ(bonus.tokens, (std::vector<int32_t>{5, 6, 2}));
  EXPECT_EQ(bonus.accepted, 2);
}

TEST(SpecAccept, MaxNewInsideTheRunEndsItThere) {
  // n = min(N, max_new - 1) in a round; a request's max_new can still end the run early when the
  // caller drafts fewer positions than it allows (here N = 3, max_new 2 keeps 2 tokens).
  const Verdict v = accept_one({5, 6, 7}, {5, 6, 7, 8}, 2, {});
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(v.accepted, 2);
}

TEST(SpecAccept, RandomRoundsFollowTheHostRoundsRule) {
  std::mt19937 g(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); };
  for (int i = 0; i < 20000; ++i) {
    const int n = pick(0, 5);
    std::vector<int32_t> target, drafts, stops;
    for (int k = 0; k <= n; ++k) target.push_back(pick(0, 12));
    for (int k = 0; k < n; ++k) drafts.push_back(pick(0, 3) ? target[size_t(k)] : pick(0, 12));
    for (int q = pick(0, 3); q > 0; --q) stops.push_back(pick(0, 12));
    const int32_t max_new = pick(1, 7);
    const Verdict want = host_round(drafts, target, max_new, stops);
    const Verdict got = accept_one(drafts, target, max_new, stops);
    ASSERT_EQ(got.tokens, want.tokens) << "case " << i;
    ASSERT_EQ(got.accepted, want.accepted) << "case " << i;
  }
}
