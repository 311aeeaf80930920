// engine/one_request (`fp4moe generate` as a one-request client of the Engine) and the rows a
// request asks the backend to hand back (RequestSpec::dump), on make-synthetic glm5-tiny (3
// layers + 1 MTP layer, vocab 1024, F32 KV) over the CPU backend:
// - the dumped logits (every prompt row from the prefill step, one row per decode step) and the
//   prompt's hidden states equal the model run directly over the same tokens (tests/model's
//   forward_sequence: one prefill step, then one step per token) bit for bit, and the greedy
//   tokens are those rows' argmax;
// - the MTP logits dump equals the MTP layer run directly over the prompt's (hidden state,
//   next token) pairs bit for bit;
// - with the prompt split into prefill chunks (chunks that do not sample still hand back their
//   rows) the dumps are whole and agree with the one-step prefill (the chunked attention reads
//   the earlier chunks' keys back from the cache: FP32 rounding only, bound 1e-5 relative);
// - a speculative run (NEXTN 3) gives the plain run's greedy tokens;
// - a backend that cannot dump refuses the request (the abort carries one line), and so does a
//   request asking for the MTP logits of a backend without the MTP layer.
#include <gtest/gtest.h>

#include <cstring>

#include "../cli/cli_run_helpers.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "backend/fake/fake_backend.hpp"
#include "engine/one_request.hpp"
#include "model/model_test_util.hpp"
#include "model/sequence_forward.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;

namespace {

const std::string& tiny_dir() { return testing_cli::synthetic_model("one_request_models", "glm5-tiny"); }

model::Model& tiny() {
  static std::unique_ptr<model::Model> m = [] {
    model::ModelOptions o;
    o.threads = 1;
    return model::Model::load(tiny_dir(), o);
  }();
  return *m;
}

std::vector<int32_t> prompt_of(int64_t n) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((5 + 41 * i) % 1024));
  return p;
}

testing_model::EngineGenerateOptions options(int64_t new_tokens, uint8_t dump) {
  testing_model::EngineGenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.threads = 1;
  o.page_size = 4;
  o.dump = dump;
  return o;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(OneRequest, DumpedLogitsAndHiddenStatesEqualTheModelOverTheSameTokensBitForBit) {
  const int64_t P = 37, N = 6;
  const auto prompt = prompt_of(P);
  const auto g = testing_model::generate_on_engine(tiny_dir(), prompt, options(N, kDumpLogits | kDumpHidden));
  const OneRequestResult& r = g.result;
  ASSERT_EQ(int64_t(r.tokens.size()), P + N);
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.usage.completion_tokens, N);
  model::Model& m = tiny();
  const int64_t V = m.config().vocab, H = m.config().hidden, L = m.config().num_layers;
  const std::vector<int32_t> fed(r.tokens.begin(), r.tokens.end() - 1);  // the last token is never fed
  testing_model::ForwardOptions fo;
  fo.page_size = 4;
  fo.hidden = true;
  const auto ref = testing_model::forward_sequence(m, fed, P, fo);
  ASSERT_EQ(int64_t(r.logits.size()), (P + N - 1) * V);
  EXPECT_TRUE(same_bytes(r.logits, ref.logits)) << "logits rows";
  for (int64_t i = P - 1; i < P + N - 1; ++i)
    EXPECT_EQ(r.tokens[size_t(i + 1)], testing_model::argmax(r.logits.data() + i * V, V)) << "greedy token " << i + 1;
  ASSERT_EQ(int64_t(r.hidden.size()), L + 1);
  for (int64_t l = 0; l <= L; ++l) {
    ASSERT_EQ(int64_t(r.hidden[size_t(l)].size()), P * H);
    EXPECT_TRUE(same_bytes(r.hidden[size_t(l)], ref.hidden[size_t(l)])) << "hidden_states." << l;
  }
}

TEST(OneRequest, MtpLogitsDumpEqualsTheMtpLayerOverThePromptPairs) {
  const int64_t P = 21;
  const auto prompt = prompt_of(P);
  const auto g = testing_model::generate_on_engine(tiny_dir(), prompt, options(3, kDumpMtpLogits));
  model::Model& m = tiny();
  const int64_t V = m.config().vocab, H = m.config().hidden;
  ASSERT_EQ(int64_t(g.result.mtp_logits.size()), (P - 1) * V);
  // The reference: the target over the prompt (its rows after the final norm), then the MTP layer
  // over positions 0 .. P-2 with token i+1, in a fresh pool with the MTP layer.
  const int64_t page = 4, pages = (P + page - 1) / page;
  model::HostKvPool kv(m.mtp_kv_geometry(page, pages, KvElem::F32), m.mtp_kv_index_layers());
  std::vector<int32_t> table(static_cast<size_t>(pages)), pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < pages; ++i) table[size_t(i)] = int32_t(i);
  for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);
  const int32_t page_ptr[2] = {0, int32_t(pages)};
  std::vector<float> hidden(static_cast<size_t>(P * H));
  {
    const int32_t qo[2] = {0, int32_t(P)}, len[1] = {int32_t(P)};
    const KvBatchView b{1, P, qo, pos.data(), len, page_ptr, table.data()};
    model::StepExtras x;
    x.final_hidden = hidden.data();
    std::vector<int32_t> toks(prompt);
    m.step(TensorView::of(toks.data(), {P}), b, kv, {}, TensorView{}, nullptr, x);
  }
  const int64_t n = P - 1;
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end()), rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = int32_t(i);
  std::vector<float> ref(static_cast<size_t>(n * V));
  const int32_t qo[2] = {0, int32_t(n)}, len[1] = {int32_t(n)};
  const KvBatchView b{1, n, qo, pos.data(), len, page_ptr, table.data()};
  m.mtp_step(TensorView::of(next.data(), {n}), hidden.data(), b, kv, rows, TensorView::of(ref.data(), {n, V}), nullptr);
  EXPECT_TRUE(same_bytes(g.result.mtp_logits, ref));
}

TEST(OneRequest, ChunkedPrefillHandsBackEveryRowOfEveryChunk) {
  const int64_t P = 30, N = 4;
  const auto prompt = prompt_of(P);
  const auto whole = testing_model::generate_on_engine(tiny_dir(), prompt, options(N, kDumpLogits | kDumpHidden));
  CpuModelBackendOptions bo;
  bo.model_dir = tiny_dir();
  bo.threads = 1;
  bo.kv_elem = KvElem::F32;
  CpuModelBackend be(bo);
  SchedulerConfig c = one_request_config(P, N, 4, 0);
  c.chunked_prefill_size = 7;  // 5 chunks, 4 that do not sample
  EngineOptions eo;
  eo.log_interval_rounds = 0;
  Engine e(c, be, eo);
  RequestSpec rq;
  rq.prompt = prompt;
  rq.max_new_tokens = int32_t(N);
  rq.ignore_eos = true;
  rq.sampling.temperature = 0.0f;
  rq.dump = kDumpLogits | kDumpHidden;
  const OneRequestResult r = run_one_request(e, rq);
  ASSERT_EQ(r.tokens, whole.result.tokens);
  ASSERT_EQ(r.logits.size(), whole.result.logits.size());
  const int64_t V = tiny().config().vocab;
  for (size_t i = 0; i < r.logits.size() / size_t(V); ++i)
    EXPECT_LE(testing_model::rel_l2(r.logits.data() + i * V, whole.result.logits.data() + i * V, size_t(V)), 1e-5)
        << "row " << i;
  ASSERT_EQ(r.hidden.size(), whole.result.hidden.size());
  for (size_t l = 0; l < r.hidden.size(); ++l)
    EXPECT_LE(testing_model::rel_l2(r.hidden[l].data(), whole.result.hidden[l].data(), r.hidden[l].size()), 1e-5)
        << "hidden_states." << l;
}

TEST(OneRequest, SpeculativeRunGivesThePlainRunsGreedyTokens) {
  const auto prompt = prompt_of(19);
  const auto plain = testing_model::generate_on_engine(tiny_dir(), prompt, options(17, 0));
  auto o = options(17, 0);
  o.speculative_steps = 3;
  const auto spec = testing_model::generate_on_engine(tiny_dir(), prompt, o);
  EXPECT_EQ(spec.result.tokens, plain.result.tokens);
  EXPECT_GE(spec.result.usage.spec_verify_steps, 1);
  int64_t rounds = 0;
  for (int64_t k : spec.accept_length) rounds += k;
  EXPECT_EQ(rounds, spec.result.usage.spec_verify_steps);
}

TEST(OneRequest, ABackendThatCannotDumpRefusesTheRequestInOneLine) {
  FakeBackendOptions fo;
  fo.vocab_size = 260;
  FakeBackend fake(fo);
  ASSERT_EQ(fake.info().dumps_rows, 0);
  EngineOptions eo;
  eo.log_interval_rounds = 0;
  Engine e(one_request_config(3, 2, 4, 0), fake, eo);
  RequestSpec rq;
  rq.prompt = {1, 2, 3};
  rq.max_new_tokens = 2;
  rq.dump = kDumpLogits;
  try {
    run_one_request(e, rq);
    FAIL() << "a dump the fake backend cannot give was accepted";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("does not hand back"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  rq.dump = 0;  // the same engine serves a plain request
  EXPECT_EQ(run_one_request(e, rq).tokens.size(), 5u);

  CpuModelBackendOptions bo;  // the CPU backend without the MTP layer: no MTP logits
  bo.model_dir = tiny_dir();
  bo.threads = 1;
  CpuModelBackend cpu(bo);
  EXPECT_EQ(cpu.info().dumps_rows, kDumpLogits | kDumpHidden);
  Engine e2(one_request_config(3, 2, 4, 0), cpu, eo);
  rq.dump = kDumpMtpLogits;
  EXPECT_THROW(run_one_request(e2, rq), Error);
}
