// --speculative-disable-by-batch-size N through the engine's scheduler on the CPU backend
// (make-synthetic glm5-tiny, F32 KV): decode rounds of more than N running requests are one plain
// step (Backend::step, which queues the pairs it completed for the MTP layer: they run before the
// next round, or as their request leaves), rounds of N or fewer
// are draft/verify rounds (Backend::decode). Checked: greedy output equals the non-speculative
// engine's token for token through the switches; no draft/verify round holds more than N
// requests, and rounds resume when the batch shrinks (and stop again when it grows); the MTP
// layer's KV rows of every request equal, bit for bit, those of a run that speculated throughout,
// and so do the MTP layer's first drafts after plain rounds; seeded sampled requests finish
// whole and reproduce their tokens. Also the flag's refusals.
#include <gtest/gtest.h>

#include <cstring>

#include "../cli/cli_run_helpers.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "engine/speculative_options.hpp"
#include "scheduler_test_util.hpp"
#include "text/tokenizer.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

const std::string& tiny_dir() { return testing_cli::synthetic_model("speculative_disable_models", "glm5-tiny"); }

// One backend call as the scheduler made it.
struct Call {
  bool decode = false;      // Backend::decode (a draft/verify round) or Backend::step
  int32_t requests = 0;
  bool all_decode = false;  // every request computes one token and samples (a decode round)
};

// The CPU backend, recording its calls, each request's latest page table, and at release the
// MTP layer's KV rows (pool layer num_layers: latent, rope key, index key) of its pages.
class SnoopBackend : public CpuModelBackend {
 public:
  using CpuModelBackend::CpuModelBackend;
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override {
    note(batch, false);
    CpuModelBackend::step(batch, out);
  }
  void decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out) override {
    note(batch, true);
    CpuModelBackend::decode(batch, limits, steps, out);
  }
  void release_requests(std::span<const uint64_t> ids) override {
    const int64_t steps0 = speculator() ? speculator()->queued_mtp_steps : 0;
    CpuModelBackend::release_requests(ids);  // runs the requests' waiting MTP pairs (their pages are the scheduler's still)
    ++release_calls;
    if (speculator()) release_mtp_steps += speculator()->queued_mtp_steps - steps0;
    if (kv_pool().geometry().num_layers <= model().config().num_layers) return;  // no MTP layer (not speculating)
    const KvLayerView& l = kv_pool().layer(model().config().num_layers);
    const size_t e = kv_elem_size(l.elem), ie = kv_elem_size(l.index_elem);
    for (uint64_t id : ids) {
      std::vector<uint8_t>& rows = mtp_rows[id];
      rows.clear();
      for (int32_t page : pages_[id])
        for (int64_t slot = 0; slot < l.page_size; ++slot) {
          const int64_t at = int64_t(page) * l.page_size + slot;
          auto put = [&](const void* base, int64_t dim, size_t elem) {
            const uint8_t* p = static_cast<const uint8_t*>(base) + size_t(at * dim) * elem;
            rows.insert(rows.end(), p, p + size_t(dim) * elem);
          };
          put(l.ckv, l.ckv_dim, e);
          put(l.kpe, l.kpe_dim, e);
          if (l.index_k) put(l.index_k, l.index_dim, ie);
        }
    }
    row_bytes = size_t(l.ckv_dim + l.kpe_dim) * e + (l.index_k ? size_t(l.index_dim) * ie : 0);
  }

  std::vector<Call> calls;
  int release_calls = 0;  // release_requests calls (the requests of one round leave in one)
  int64_t release_mtp_steps = 0;  // MTP steps those calls ran (the leaving requests' waiting pairs)
  std::map<uint64_t, std::vector<uint8_t>> mtp_rows;  // per request: row_bytes per position, in position order
  size_t row_bytes = 0;

 private:
  void note(const StepBatch& b, bool decode) {
    Call c{decode, b.num_requests(), true};
    for (int32_t r = 0; r < b.num_requests(); ++r) {
      c.all_decode = c.all_decode && b.count(r) == 1 && b.sample[size_t(r)];
      const auto t = b.page_table(r);
      pages_[b.request_ids[size_t(r)]].assign(t.begin(), t.end());
    }
    calls.push_back(c);
  }
  std::map<uint64_t, std::vector<int32_t>> pages_;
};

// The MTP's own draft at each (request, output index) a round's draft k = 0 proposed for (with
// --speculative-num-steps 1 every draft is a round's first), and the token proposed instead.
using Drafts = std::map<std::pair<uint64_t, uint64_t>, int32_t>;

struct RunResult {
  std::map<uint64_t, Outcome> out;
  SchedulerStats stats;
  std::vector<Call> calls;
  int release_calls = 0;  // release_requests calls (the requests of one round leave in one)
  int64_t release_mtp_steps = 0;
  std::map<uint64_t, std::vector<uint8_t>> mtp_rows;
  size_t row_bytes = 0;
  Drafts mtp_drafts;
  int64_t mtp_steps = 0;  // MTP steps over queued pairs (prompts, plain rounds' pairs)
};

std::vector<RequestSpec> greedy_specs(int n) {
  std::vector<RequestSpec> specs;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    for (int j = 0; j < 6 + 9 * i; ++j) s.prompt.push_back((11 + 53 * j + 97 * i) % 1024);
    s.sampling.temperature = 0.0f;
    s.max_new_tokens = 9 + 7 * i;  // unequal: the batch shrinks one request at a time
    specs.push_back(s);
  }
  return specs;
}

// Runs specs on the CPU backend with `steps` draft steps (0: no speculation) and
// --speculative-disable-by-batch-size `disable_by` (0: off). Requests with index >= `early` are
// added once request 1 has `late_after` generated tokens (all at once when early >= size).
// drafts_from: forced drafts (the plain run's tokens, every fourth one wrong) for accepts and rejects.
RunResult run(const std::vector<RequestSpec>& specs, int32_t steps, int32_t disable_by,
        const std::map<uint64_t, Outcome>* drafts_from = nullptr, size_t early = 1000, int32_t late_after = 0,
        const std::string& model_dir = tiny_dir()) {
  CpuModelBackendOptions o;
  o.model_dir = model_dir;
  o.threads = 1;
  o.kv_elem = KvElem::F32;
  o.speculative_steps = steps;
  RunResult res;
  if (steps > 0)
    o.draft_override = [drafts_from, &res](uint64_t id, uint64_t idx, int32_t mtp) {
      res.mtp_drafts[{id, idx}] = mtp;
      if (!drafts_from) return mtp;
      const auto& toks = drafts_from->at(id).tokens;
      const int32_t t = idx < toks.size() ? toks[idx] : mtp;
      return idx % 4 == 3 ? (t + 1) % 1024 : t;
    };
  SnoopBackend be(o);
  SchedulerConfig c = config(16, 128, 8, 64, 1, false);  // no radix cache: every MTP row is the request's own
  c.eos_ids = {};
  c.speculative_tokens = steps > 0 ? steps + 1 : 0;
  c.speculative_disable_by_batch_size = disable_by;
  be.init_kv(c.num_pages, c.page_size, c.chunked_prefill_size + c.max_running, c.max_running);
  Scheduler s(c, be);
  EventSink sink = [&](uint64_t id, OutputEvent&& ev) {
    Outcome& oc = res.out[id];
    for (auto& t : ev.tokens) oc.tokens.push_back(t.id);
    if (ev.finished) {
      oc.finished = true;
      oc.reason = ev.reason;
      oc.abort_message = ev.abort_message;
      oc.usage = ev.usage;
    }
  };
  const size_t first = std::min(early, specs.size());
  for (size_t i = 0; i < first; ++i) s.add(i + 1, specs[i]);
  bool added = first == specs.size();
  for (int round = 0; !s.idle() || !added; ++round) {
    if (round > 10000) {
      ADD_FAILURE() << "scheduler did not finish";
      break;
    }
    if (!added && (res.out[1].tokens.size() >= size_t(late_after) || s.idle())) {
      for (size_t i = first; i < specs.size(); ++i) s.add(i + 1, specs[i]);
      added = true;
    }
    s.run_round(sink);
    s.check_invariants();
  }
  res.stats = s.stats();
  res.calls = be.calls;
  res.mtp_rows = be.mtp_rows;
  res.row_bytes = be.row_bytes;
  res.release_calls = be.release_calls;
  res.release_mtp_steps = be.release_mtp_steps;
  if (be.speculator()) res.mtp_steps = be.speculator()->queued_mtp_steps;
  return res;
}

void expect_same_tokens(const std::map<uint64_t, Outcome>& a, const std::map<uint64_t, Outcome>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, o] : a) {
    const Outcome& p = b.at(id);
    EXPECT_TRUE(o.finished) << "request " << id;
    EXPECT_EQ(o.tokens, p.tokens) << "request " << id;
    EXPECT_EQ(o.reason, p.reason) << "request " << id;
    EXPECT_EQ(o.usage.completion_tokens, p.usage.completion_tokens) << "request " << id;
  }
}

// Decode rounds by kind and size.
struct RoundCounts {
  int32_t verify = 0, plain = 0, largest_verify = 0, smallest_plain = 1 << 30;
};
RoundCounts count_rounds(const std::vector<Call>& calls) {
  RoundCounts n;
  for (const Call& c : calls) {
    if (c.decode) {
      ++n.verify;
      n.largest_verify = std::max(n.largest_verify, c.requests);
    } else if (c.all_decode) {
      ++n.plain;
      n.smallest_plain = std::min(n.smallest_plain, c.requests);
    }
  }
  return n;
}

// Compares every request's MTP KV rows (the positions it wrote) of two runs, bit for bit.
void expect_same_mtp_rows(const RunResult& a, const RunResult& b, const std::vector<RequestSpec>& specs) {
  ASSERT_EQ(a.row_bytes, b.row_bytes);
  ASSERT_GT(a.row_bytes, 0u);
  for (const auto& [id, o] : a.out) {
    const size_t written = specs[id - 1].prompt.size() + o.tokens.size() - 1;
    const auto& x = a.mtp_rows.at(id);
    const auto& y = b.mtp_rows.at(id);
    ASSERT_GE(x.size(), written * a.row_bytes);
    ASSERT_GE(y.size(), written * a.row_bytes);
    for (size_t p = 0; p < written; ++p)
      ASSERT_EQ(std::memcmp(x.data() + p * a.row_bytes, y.data() + p * a.row_bytes, a.row_bytes), 0)
          << "request " << id << ": MTP KV row of position " << p << " differs";
  }
}

}  // namespace

// N = 1, four greedy requests of unequal lengths: plain steps while two or more run, draft/verify
// rounds for the last one; the tokens are the plain engine's, with the MTP layer's own drafts
// (mostly rejected) and with forced drafts (accepts and rejects), at 1 and 3 draft steps.
TEST(SpeculativeDisable, AtBatchSizeOneFourGreedyRequestsEqualThePlainEngine) {
  const auto specs = greedy_specs(4);
  const RunResult plain = run(specs, 0, 0);
  for (int32_t n : {1, 3}) {
    for (bool forced : {false, true}) {
      SCOPED_TRACE(::testing::Message() << n << " draft steps, " << (forced ? "forced" : "own") << " drafts");
      const RunResult r = run(specs, n, 1, forced ? &plain.out : nullptr);
      expect_same_tokens(r.out, plain.out);
      const RoundCounts k = count_rounds(r.calls);
      EXPECT_EQ(k.largest_verify, 1) << "a draft/verify round held more than N = 1 requests";
      EXPECT_GT(k.verify, 0) << "no draft/verify round once one request was left";
      EXPECT_GE(k.smallest_plain, 2) << "a plain decode round of one request (N = 1 speculates there)";
      EXPECT_GT(k.plain, 0);
      EXPECT_EQ(r.stats.verify_steps, k.verify);
      EXPECT_EQ(r.stats.spec_disabled_rounds, k.plain);
      int64_t verify = 0;
      for (const auto& [id, o] : r.out) verify += o.usage.spec_verify_steps;
      EXPECT_EQ(verify, k.verify) << "one request per round";
    }
  }
}

// N = 2: request 1 runs alone (rounds), three more join (four running: plain steps), they finish
// one by one (rounds again at two and one). No round holds more than two requests; the tokens
// are the plain engine's under the same arrival schedule.
TEST(SpeculativeDisable, ABatchThatGrowsPastNAndShrinksBelowSwitchesBothWays) {
  auto specs = greedy_specs(4);
  specs[0].max_new_tokens = 60;  // outlives the others
  const RunResult plain = run(specs, 0, 0, nullptr, 1, 8);
  const RunResult r = run(specs, 3, 2, &plain.out, 1, 8);
  expect_same_tokens(r.out, plain.out);
  // The call sequence: rounds of one request, then plain steps of more than two, then rounds of two or one.
  size_t i = 0;
  const auto& c = r.calls;
  int32_t before = 0, plain_big = 0, after = 0;
  for (; i < c.size() && !(c[i].all_decode && c[i].requests > 2); ++i) before += c[i].decode;
  for (; i < c.size() && !c[i].decode; ++i) plain_big += c[i].all_decode && c[i].requests > 2;
  for (; i < c.size(); ++i) {
    EXPECT_FALSE(c[i].all_decode && !c[i].decode && c[i].requests <= 2) << "call " << i << ": a plain round at <= N";
    after += c[i].decode;
  }
  EXPECT_GT(before, 0) << "no round while request 1 ran alone";
  EXPECT_GT(plain_big, 0) << "no plain step above N";
  EXPECT_GT(after, 0) << "no round after the batch shrank";
  for (size_t k = 0; k < c.size(); ++k) EXPECT_TRUE(!c[k].decode || c[k].requests <= 2) << "call " << k;
  EXPECT_EQ(r.stats.spec_disabled_rounds, plain_big);
}

// The MTP layer's state after plain rounds is what speculating throughout leaves: every
// request's MTP KV rows (latent, rope key, index key of every position it wrote) are equal bit
// for bit, and with one draft step (every draft a round's first, read from the MTP layer's last
// logits) its own drafts at every output index both runs drafted for are equal.
TEST(SpeculativeDisable, TheMtpLayersStateAfterPlainRoundsEqualsARunThatSpeculatedThroughout) {
  const auto specs = greedy_specs(4);
  const RunResult plain = run(specs, 0, 0);
  for (int32_t n : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << n << " draft steps");
    const RunResult always = run(specs, n, 0, &plain.out);
    const RunResult switched = run(specs, n, 1, &plain.out);
    expect_same_tokens(always.out, plain.out);
    expect_same_tokens(switched.out, plain.out);
    EXPECT_GT(count_rounds(switched.calls).plain, 0) << "no plain round: nothing to compare";
    EXPECT_EQ(count_rounds(always.calls).plain, 0);
    expect_same_mtp_rows(always, switched, specs);
    // The plain rounds' pairs waited and ran together (before a round, or as a request left):
    // fewer MTP steps than plain rounds (one each before settle_queued).
    EXPECT_LT(switched.mtp_steps, count_rounds(switched.calls).plain)
        << switched.mtp_steps << " MTP steps over queued pairs";
  }
  // The MTP layer's own drafts (mostly rejected with random weights: rounds start at almost every
  // output index, so the two runs share many): one draft step, each a round's first.
  const RunResult always = run(specs, 1, 0), switched = run(specs, 1, 1);
  expect_same_tokens(switched.out, plain.out);
  EXPECT_GT(count_rounds(switched.calls).plain, 0);
  int32_t common = 0;
  for (const auto& [key, tok] : switched.mtp_drafts) {
    const auto it = always.mtp_drafts.find(key);
    if (it == always.mtp_drafts.end()) continue;
    ++common;
    EXPECT_EQ(tok, it->second) << "request " << key.first << ", the draft for output index " << key.second;
  }
  // Request 4 (30 tokens) speculates alone after 23 tokens of plain steps: its drafts follow them.
  EXPECT_GE(common, 4);
}

TEST(SpeculativeDisable, RequestsThatLeaveTogetherRunTheirWaitingPairsInOneMtpStep) {
  // Four requests of one length above N = 1: every decode round is plain, the pairs wait, and the
  // four leave in the same round — one release call, whose waiting pairs run as one MTP step.
  auto specs = greedy_specs(4);
  for (size_t i = 0; i < specs.size(); ++i) {  // prompts of one prefill step (30 tokens, chunk 64): lockstep decodes
    specs[i].prompt.resize(6 + i);
    specs[i].max_new_tokens = 8;
  }
  const RunResult plain = run(specs, 0, 0);
  const RunResult always = run(specs, 1, 0, &plain.out);
  const RunResult switched = run(specs, 1, 1, &plain.out);
  expect_same_tokens(switched.out, plain.out);
  EXPECT_EQ(count_rounds(switched.calls).verify, 0) << "a draft/verify round above N";
  EXPECT_EQ(switched.release_calls, 1);
  expect_same_mtp_rows(always, switched, specs);
  // The prompts' pairs and the plain rounds' (~30 + 4 x 7) stay within defer_rows (a step's 72
  // tokens): all of them wait to the end and run as the four leave, in one MTP step.
  EXPECT_EQ(switched.release_mtp_steps, 1);
  EXPECT_EQ(switched.mtp_steps, 1);
}

// The trained model in the tree (models/glm5-mini-py: its MTP layer's own drafts are often
// accepted), four greedy Python-text prompts at N = 1: the plain engine's tokens, and MTP KV rows
// equal to a run that speculated throughout.
TEST(SpeculativeDisable, TheTrainedModelsOwnDraftsThroughTheSwitchesKeepTokensAndMtpState) {
  const std::string dir = std::string(FP4MOE_SOURCE_DIR) + "/models/glm5-mini-py";
  const text::Tokenizer tok = text::Tokenizer::from_dir(dir);
  std::vector<RequestSpec> specs;
  const char* texts[] = {"import os\nimport sys\n", "def main(argv):\n", "class Reader:\n    def __init__(self",
                         "for i in range("};
  for (int i = 0; i < 4; ++i) {
    RequestSpec s;
    s.prompt = tok.encode(texts[i], false);
    s.sampling.temperature = 0.0f;
    s.max_new_tokens = 12 + 8 * i;
    specs.push_back(s);
  }
  const RunResult plain = run(specs, 0, 0, nullptr, 1000, 0, dir);
  const RunResult always = run(specs, 3, 0, nullptr, 1000, 0, dir);
  const RunResult switched = run(specs, 3, 1, nullptr, 1000, 0, dir);
  expect_same_tokens(always.out, plain.out);
  expect_same_tokens(switched.out, plain.out);
  const RoundCounts k = count_rounds(switched.calls);
  EXPECT_GT(k.plain, 0);
  EXPECT_GT(k.verify, 0);
  EXPECT_EQ(k.largest_verify, 1);
  int64_t tokens = 0, rounds = 0;
  for (const auto& [id, o] : always.out) tokens += o.usage.completion_tokens, rounds += o.usage.spec_verify_steps;
  EXPECT_LT(rounds, tokens) << "the trained MTP layer's drafts were never accepted";
  expect_same_mtp_rows(always, switched, specs);
}

// Seeded sampled requests through the switches: every request finishes whole (no abort), and
// the same schedule reproduces its tokens.
TEST(SpeculativeDisable, SeededSampledRequestsFinishAndReproduceThroughTheSwitches) {
  auto specs = greedy_specs(4);
  for (auto& s : specs) {
    s.sampling.temperature = 0.9f;
    s.sampling.top_k = 40;
    s.sampling.seed = 77 + s.prompt.size();
    s.sampling.has_seed = true;
  }
  const RunResult a = run(specs, 3, 2), b = run(specs, 3, 2);
  expect_same_tokens(a.out, b.out);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Outcome& o = a.out.at(i + 1);
    EXPECT_EQ(o.reason, FinishReason::kLength) << o.abort_message;
    EXPECT_EQ(int32_t(o.tokens.size()), specs[i].max_new_tokens);
  }
  const RoundCounts k = count_rounds(a.calls);
  EXPECT_GT(k.verify, 0);
  EXPECT_GT(k.plain, 0);
  EXPECT_LE(k.largest_verify, 2);
}

TEST(SpeculativeDisable, TheFlagIsRefusedWithoutSpeculationAndBelowOne) {
  SpeculativeFlags f;
  EXPECT_EQ(speculative_disable_by_batch_size(f, true), 0);  // not given: off
  EXPECT_EQ(speculative_disable_by_batch_size(f, false), 0);
  f.disable_by_batch_size = 8;
  EXPECT_EQ(speculative_disable_by_batch_size(f, true), 8);
  EXPECT_THROW(speculative_disable_by_batch_size(f, false), Error);
  for (int32_t bad : {0, -3}) {
    f.disable_by_batch_size = bad;
    EXPECT_THROW(speculative_disable_by_batch_size(f, true), Error) << bad;
  }
  // The scheduler refuses it without speculation.
  FakeBackend be(fake_options());
  SchedulerConfig c = config(16, 64, 4, 64, 1, true);
  c.speculative_disable_by_batch_size = 2;
  EXPECT_THROW(Scheduler(c, be), Error);
  c.speculative_tokens = 4;
  c.speculative_disable_by_batch_size = -1;
  EXPECT_THROW(Scheduler(c, be), Error);
}
