// Every abort says why in the server log: one warn line "scheduler: request <id> aborted:
// <reason>" — a token the grammar refuses (a backend that ignored the mask), a cancelled
// request, one whose step failed (StepError) — so that a log always
// names the reason a client only sees as finish_reason "abort".
#include <gtest/gtest.h>

#include <string>

#include "grammar/grammar.hpp"
#include "scheduler_test_util.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;

namespace {

// Samples `token` for every request whatever its mask says; fails its step for request fail_id.
class StubbornBackend : public FakeBackend {
 public:
  StubbornBackend(int32_t token, uint64_t fail_id) : FakeBackend(fake_options()), token_(token), fail_id_(fail_id) {}
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override {
    for (uint64_t id : batch.request_ids)
      if (id == fail_id_) throw StepError("the stub's step failed", {id});
    for (int32_t r = 0; r < batch.num_requests(); ++r)
      if (batch.sample[size_t(r)]) out.push_back(GeneratedToken{token_});
  }

 private:
  int32_t token_;
  uint64_t fail_id_;
};

grammar::GrammarPtr digits_grammar() {  // [0-9]+ over the fake backend's 260 ids (0-255 bytes, 256 EOS)
  grammar::Vocab v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, char(b)));
  for (int i = 256; i < 260; ++i) v.token_bytes.push_back("");
  v.vocab_size = 260;
  v.stop_ids = {kEos};
  static grammar::Compiler c(v);
  return c.compile({grammar::Kind::kRegex, "[0-9]+", true});
}

}  // namespace

TEST(SchedulerAbortLog, EveryAbortIsOneWarnLineWithTheRequestAndTheReason) {
  StubbornBackend be('x', 3);
  SchedulerConfig c = config(16, 8, 8, 64, 1, false);
  std::vector<RequestSpec> sp(4);
  for (auto& s : sp) {
    s.prompt = {1, 2, 3};
    s.max_new_tokens = 4;
  }
  sp[0].grammar = digits_grammar();  // 1: 'x' is refused
  sp[3].prompt.assign(200, 7);       // 4: 8 pages of 16 cannot hold it
  sp[3].max_new_tokens = 1;
  c.context_length = 1 << 20;
  ::testing::internal::CaptureStderr();
  std::map<uint64_t, Outcome> out;
  {
    be.init_kv(c.num_pages, c.page_size, c.chunked_prefill_size + c.max_running, c.max_running);
    Scheduler s(c, be);
    EventSink sink = [&](uint64_t id, OutputEvent&& ev) {
      if (ev.finished) out[id].reason = ev.reason, out[id].abort_message = ev.abort_message, out[id].finished = true;
    };
    for (size_t i = 0; i < 3; ++i) s.add(i + 1, sp[i]);
    s.cancel(2, "cancelled", sink);
    for (int round = 0; round < 100 && !s.idle(); ++round) s.run_round(sink);
    EXPECT_THROW(s.add(4, sp[3]), Error) << "over the pool: refused when added";
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(out.size(), 3u);
  for (uint64_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(out[id].reason, FinishReason::kAbort) << id;
    const std::string line = "scheduler: request " + std::to_string(id) + " aborted: " + out[id].abort_message;
    EXPECT_NE(log.find(line), std::string::npos) << "missing \"" << line << "\" in:\n" << log;
  }
  EXPECT_NE(out[1].abort_message.find("the sampled token 120 is not one the grammar allows"), std::string::npos)
      << out[1].abort_message;
  EXPECT_EQ(out[2].abort_message, "cancelled");
  EXPECT_NE(out[3].abort_message.find("the stub's step failed"), std::string::npos) << out[3].abort_message;
}
