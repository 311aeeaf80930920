// Drives a Scheduler over the fake backend to completion and records what came out.
#pragma once

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/fake/fake_backend.hpp"
#include "engine/scheduler.hpp"

namespace fp4moe::engine::testing {

constexpr int32_t kEos = 256;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  int32_t matched = -1;
  std::string abort_message;  // why, when reason is kAbort
  Usage usage;
  int32_t events = 0;
};

// One step() call as the backend saw it: per request (id, tokens, start, samples).
struct StepRow {
  uint64_t id;
  int32_t count;
  int32_t start;
  bool samples;
};

class RecordingBackend : public FakeBackend {
 public:
  explicit RecordingBackend(FakeBackendOptions o) : FakeBackend(o) {}
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override {
    auto& rows = steps.emplace_back();
    for (int32_t r = 0; r < batch.num_requests(); ++r)
      rows.push_back({batch.request_ids[size_t(r)], batch.count(r), batch.start(r), batch.sample[size_t(r)] != 0});
    FakeBackend::step(batch, out);
  }
  void release_requests(std::span<const uint64_t> ids) override {
    released.insert(released.end(), ids.begin(), ids.end());
    release_calls.emplace_back(ids.begin(), ids.end());
  }
  std::vector<std::vector<StepRow>> steps;
  std::vector<uint64_t> released;
  std::vector<std::vector<uint64_t>> release_calls;  // the ids of each release_requests call
};

inline FakeBackendOptions fake_options() {
  FakeBackendOptions o;
  o.vocab_size = 260;
  o.eos_id = kEos;
  o.eos_period = 16;
  return o;
}

inline SchedulerConfig config(int32_t page, int32_t pages, int32_t max_running, int32_t chunk, int32_t steps, bool radix) {
  SchedulerConfig c;
  c.page_size = page;
  c.num_pages = pages;
  c.max_running = max_running;
  c.chunked_prefill_size = chunk;
  c.decode_steps = steps;
  c.radix_cache = radix;
  c.context_length = 1 << 20;
  c.eos_ids = {kEos};
  return c;
}

// Runs specs (ids 1..n) to completion; calls each_round after every round; checks the page
// invariants after every round.
inline std::map<uint64_t, Outcome> run_all(const SchedulerConfig& cfg, const std::vector<RequestSpec>& specs,
                                           Backend& backend, SchedulerStats* stats = nullptr,
                                           const std::function<void(Scheduler&, int)>& each_round = {}) {
  backend.init_kv(cfg.num_pages, cfg.page_size, cfg.chunked_prefill_size + cfg.max_running, cfg.max_running);
  Scheduler s(cfg, backend);
  std::map<uint64_t, Outcome> out;
  for (size_t i = 0; i < specs.size(); ++i) s.add(i + 1, specs[i]);
  EventSink sink = [&](uint64_t id, OutputEvent&& ev) {
    Outcome& o = out[id];
    EXPECT_FALSE(o.finished) << "event after the finish for request " << id;
    ++o.events;
    for (auto& t : ev.tokens) {
      o.tokens.push_back(t.id);
      o.logprobs.push_back(t.logprob);
    }
    if (ev.finished) {
      o.finished = true;
      o.reason = ev.reason;
      o.matched = ev.matched_stop_id;
      o.abort_message = ev.abort_message;
      o.usage = ev.usage;
    }
  };
  for (int round = 0; !s.idle(); ++round) {
    if (round > 200000) {
      ADD_FAILURE() << "scheduler did not finish";
      break;
    }
    s.run_round(sink);
    s.check_invariants();
    if (each_round) each_round(s, round);
  }
  s.check_invariants();
  if (stats) *stats = s.stats();
  return out;
}

// Each spec alone, one at a time, on a large pool: the reference outputs.
inline std::map<uint64_t, Outcome> run_alone(const std::vector<RequestSpec>& specs) {
  std::map<uint64_t, Outcome> ref;
  for (size_t i = 0; i < specs.size(); ++i) {
    FakeBackend be(fake_options());
    auto one = run_all(config(16, 1024, 1, 4096, 1, false), {specs[i]}, be);
    ref[i + 1] = one[1];
  }
  return ref;
}

inline std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = tok(rng);
  return p;
}

// n requests of random prompt_len-token prompts, max_new tokens each, EOS ignored.
inline std::vector<RequestSpec> uniform_requests(int32_t n, int32_t prompt_len, int32_t max_new, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> specs(static_cast<size_t>(n));
  for (auto& s : specs) {
    s.prompt = random_prompt(rng, prompt_len);
    s.max_new_tokens = max_new;
    s.ignore_eos = true;
  }
  return specs;
}

}  // namespace fp4moe::engine::testing
