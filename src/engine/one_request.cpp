#include "engine/one_request.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>

#include "core/error.hpp"
#include "engine/page_pool.hpp"

namespace fp4moe::engine {
namespace {

// Rows [0, n) of one kind (and layer) from the dumps, by position; every row must have come.
std::vector<float> place(const std::vector<RowDump>& dumps, DumpRows what, int32_t layer, int64_t n, const char* name) {
  std::vector<float> out;
  std::vector<uint8_t> have(size_t(std::max<int64_t>(n, 0)), 0);
  int64_t width = -1;
  for (const RowDump& d : dumps) {
    if (d.what != what || d.layer != layer) continue;
    FP4MOE_CHECK(d.width > 0 && int64_t(d.data.size()) == int64_t(d.rows) * d.width && (width < 0 || width == d.width),
                 "{}: a dump of {} rows x {} floats holds {}", name, d.rows, d.width, d.data.size());
    if (width < 0) {
      width = d.width;
      out.assign(size_t(n * width), 0.0f);
    }
    for (int32_t i = 0; i < d.rows; ++i) {
      const int64_t p = int64_t(d.start) + i;
      if (p < 0 || p >= n) continue;  // beyond what the layout keeps (a decode row of the hidden states, the last pair)
      std::memcpy(out.data() + p * width, d.data.data() + int64_t(i) * width, size_t(width) * sizeof(float));
      have[size_t(p)] = 1;
    }
  }
  const auto missing = std::find(have.begin(), have.end(), uint8_t(0));
  FP4MOE_CHECK(missing == have.end(), "{}: row {} of {} was not handed back by the backend", name,
               missing - have.begin(), n);
  return out;
}

}  // namespace

SchedulerConfig one_request_config(int64_t prompt_tokens, int64_t max_new_tokens, int32_t page_size,
                                   int32_t speculative_steps) {
  FP4MOE_CHECK(prompt_tokens >= 1 && max_new_tokens >= 1 && prompt_tokens + max_new_tokens <= INT32_MAX,
               "a request of {} prompt + {} new tokens", prompt_tokens, max_new_tokens);
  FP4MOE_CHECK(page_size >= 1, "page size {} must be >= 1", page_size);
  SchedulerConfig c;
  c.page_size = page_size;
  c.num_pages = pages_for_tokens(prompt_tokens + max_new_tokens, page_size);
  c.max_running = 1;
  c.chunked_prefill_size = int32_t(prompt_tokens);  // the whole prompt in one prefill step
  c.decode_steps = 1;
  c.speculative_tokens = speculative_steps > 0 ? speculative_steps + 1 : 0;
  c.radix_cache = false;
  c.context_length = int32_t(std::max<int64_t>(prompt_tokens + max_new_tokens, 2));
  return c;
}

OneRequestResult run_one_request(Engine& engine, RequestSpec spec, const OneRequestObserver* observer) {
  OneRequestResult r;
  r.tokens = spec.prompt;
  r.prompt_tokens = int64_t(spec.prompt.size());
  const uint8_t dump = spec.dump;
  auto channel = std::make_shared<OutputChannel>();
  std::vector<uint64_t> ids;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  std::vector<RequestSpec> specs;
  specs.push_back(std::move(spec));
  switch (engine.submit(std::move(specs), channel, ids)) {
    case Engine::Submit::kOk: break;
    case Engine::Submit::kQueueFull: FP4MOE_FAIL("the engine's queue is full");
    case Engine::Submit::kStopped:
      FP4MOE_FAIL("the engine takes no requests{}", engine.failed() ? ": it failed: " + engine.failure() : "");
  }
  std::optional<Clock::time_point> t1;
  std::vector<RowDump> dumps;
  std::vector<OutputChannel::Item> items;
  bool finished = false;
  while (!finished) {
    items.clear();
    if (!channel->wait(items, std::chrono::milliseconds(200))) {
      FP4MOE_CHECK(!engine.failed(), "the engine failed: {}", engine.failure());
      continue;
    }
    for (OutputChannel::Item& it : items) {
      OutputEvent& ev = it.event;
      if (!ev.tokens.empty() && !t1) t1 = Clock::now();
      for (GeneratedToken& t : ev.tokens) {
        r.tokens.push_back(t.id);
        r.generated.push_back(std::move(t));
      }
      for (RowDump& d : ev.dumps) dumps.push_back(std::move(d));
      if (ev.finished) {
        finished = true;
        r.reason = ev.reason;
        r.usage = ev.usage;
        FP4MOE_CHECK(ev.reason != FinishReason::kAbort, "{}", ev.abort_message);
      }
    }
  }
  Clock::time_point t2 = Clock::now();
  if (!t1) t1 = t2;
  if (observer && observer->first_step) {  // the engine thread's step ends (it emitted the events after them)
    t1 = *observer->first_step;
    t2 = *observer->last_step;
  }
  r.prefill_seconds = std::chrono::duration<double>(*t1 - t0).count();
  r.decode_seconds = std::chrono::duration<double>(t2 - *t1).count();

  const int64_t P = r.prompt_tokens, T = int64_t(r.tokens.size());
  if (dump & kDumpLogits) r.logits = place(dumps, kDumpLogits, 0, T - 1, "the logits dump");
  if (dump & kDumpHidden) {
    int32_t layers = 0;
    for (const RowDump& d : dumps)
      if (d.what == kDumpHidden) layers = std::max(layers, d.layer + 1);
    FP4MOE_CHECK(layers > 0, "the hidden-states dump: the backend handed back none");
    for (int32_t l = 0; l < layers; ++l) r.hidden.push_back(place(dumps, kDumpHidden, l, P, "the hidden-states dump"));
  }
  if (dump & kDumpMtpLogits) r.mtp_logits = place(dumps, kDumpMtpLogits, 0, P - 1, "the MTP logits dump");
  return r;
}

}  // namespace fp4moe::engine
