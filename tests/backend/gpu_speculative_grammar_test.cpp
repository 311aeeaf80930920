// Constrained requests in speculative (NEXTN) rounds on the CUDA backend, through the engine's
// scheduler, on the trained model in the tree (models/glm5-mini-py) with its own tokenizer and
// the device check's grammars (tools/device/structured_check.py: a JSON schema closed by `]}`,
// the regex `[0-9]{3}-[a-z]{4}( OK| NO)`; tests/engine/trained_structured_util.hpp):
//   - sampled requests (temperature 0.7-1.0, top_p, top_k; 8 seeds x 2 grammars), NEXTN 3, one
//     at a time and 4 at once, and the plain engine for comparison: no request aborts and every
//     finished text validates (checkers that share no code with xgrammar). On a failure every
//     round of the request is printed (model::RoundTrace: drafts, accepted, emitted, per row the
//     mask's size, whether the emitted token is inside it, non-finite logits among the allowed
//     tokens) with the abort message, which the scheduler also logs at warn level;
//   - greedy constrained NEXTN equals greedy constrained plain, token for token up to the first
//     position whose margin allows a flip: the verify step computes each row as one row of a
//     larger decode batch, so its logits equal the plain step's up to the GEMMs' row-count-dependent
//     rounding (BF16 activations, rel ~1e-3); a greedy constrained token is the argmax over the
//     allowed tokens, so it can differ only where the best two allowed logits (teacher-forced
//     runner over the plain tokens) are within 1e-2, several times that noise.
// Compiled here for sm_90a; it runs on the device machine (label backend-gpu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_model_backend.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "engine/trained_structured_util.hpp"
#include "gpu_test.hpp"
#include "model/speculative.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;
using namespace fp4moe::engine::testing;
using engine::gpu::CudaModelBackend;
using engine::gpu::CudaModelBackendOptions;
using engine::gpu::GpuRunner;
using engine::gpu::RunnerOptions;
using testing_gpu_runner::small_options;

namespace {

constexpr float kMargin = 1e-2f;
constexpr int32_t kVocab = 4096;  // models/glm5-mini-py/config.json

RunnerOptions engine_runner() {
  RunnerOptions o = small_options();
  o.max_requests = 4;
  o.max_tokens = 256 + 4;
  o.max_context = 256;
  o.cuda_graph_max_bs = -1;  // up to max_requests (x (N + 1) with speculation): verify steps replay graphs
  o.poison = false;
  return o;
}

const TrainedStructured& trained() {
  static const TrainedStructured t(kVocab);
  return t;
}

struct SpecRun {
  std::map<uint64_t, Outcome> out;
  std::map<uint64_t, std::vector<model::RoundTrace>> rounds;  // per request, every host round
  SchedulerStats stats;
};

SpecRun run(const std::vector<RequestSpec>& sp, int32_t steps, int32_t max_running) {
  CudaModelBackendOptions o;
  o.model_dir = trained_model_dir();
  o.runner = engine_runner();
  o.speculative_steps = steps;
  CudaModelBackend be(o);
  SpecRun r;
  if (model::MtpSpeculator* s = be.speculator())
    s->on_round = [&r](const model::RoundTrace& t) { r.rounds[t.id].push_back(t); };
  SchedulerConfig c = config(16, 128, max_running, 256, 1, true);  // 2048 tokens: 4 requests x 256, within the runner's pool
  c.eos_ids = trained().eos;
  c.speculative_tokens = steps > 0 ? steps + 1 : 0;
  r.out = run_all(c, sp, be, &r.stats);
  return r;
}

// Every round of the requests that aborted, emitted outside a mask or met non-finite logits, printed.
void print_failed_rounds(const SpecRun& r, const std::string& what) {
  for (const auto& [id, o] : r.out) {
    bool outside = false;
    if (auto it = r.rounds.find(id); it != r.rounds.end())
      for (const auto& t : it->second)
        outside = outside || t.emitted_outside_mask() ||
                  std::any_of(t.nonfinite.begin(), t.nonfinite.end(), [](int32_t x) { return x > 0; });
    if (o.reason != FinishReason::kAbort && !outside) continue;
    std::printf("%s: request %llu: %s (abort: %s)\n", what.c_str(), static_cast<unsigned long long>(id),
                trained().text(o.tokens).c_str(), o.abort_message.c_str());
    if (auto it = r.rounds.find(id); it != r.rounds.end())
      for (const auto& t : it->second) std::printf("    %s\n", t.describe().c_str());
  }
}

}  // namespace

TEST(GpuSpeculativeGrammar, SampledStructuredRequestsNeverAbortAndValidate) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const TrainedStructured& t = trained();
  const auto sp = structured_requests(t, true, 8);
  const SpecRun plain = run(sp, 0, 1);
  EXPECT_GE(expect_structured_valid(t, sp, plain.out, "plain"), 10);
  for (const int32_t running : {1, 4}) {
    const std::string what = "NEXTN 3, max_running " + std::to_string(running);
    const SpecRun spec = run(sp, 3, running);
    EXPECT_GE(expect_structured_valid(t, sp, spec.out, what), 10) << "most requests end within their tokens";
    EXPECT_GT(spec.stats.verify_steps, 0);
    int64_t rounds = 0, outside = 0, nonfinite = 0;
    for (const auto& [id, ts] : spec.rounds)
      for (const auto& tr : ts) {
        rounds += 1, outside += tr.emitted_outside_mask();
        for (int32_t x : tr.nonfinite) nonfinite += x;
      }
    EXPECT_GT(rounds, 0) << "host rounds ran (constrained requests never take the device round)";
    EXPECT_EQ(outside, 0) << what << ": rounds emitted a token outside its grammar mask";
    EXPECT_EQ(nonfinite, 0) << what << ": verify rows with non-finite logits where the grammar allows a token";
    print_failed_rounds(spec, what);
  }
}

TEST(GpuSpeculativeGrammar, GreedyStructuredNextnEqualsPlainWhereTheMarginAllows) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const TrainedStructured& t = trained();
  const auto sp = structured_requests(t, false, 1);
  const SpecRun plain = run(sp, 0, 1);
  ASSERT_EQ(expect_structured_valid(t, sp, plain.out, "plain"), 2);
  // Margins: per generated token j of the plain run, the best two allowed logits' gap (the
  // teacher-forced runner's row P - 1 + j, the matcher's mask after tokens < j).
  std::map<uint64_t, std::vector<float>> margin;
  {
    RunnerOptions ro = small_options();
    ro.max_tokens = 256;
    ro.max_context = 256;
    auto gpu = GpuRunner::load(trained_model_dir(), ro);
    const int64_t V = gpu->config().vocab;
    for (size_t i = 0; i < sp.size(); ++i) {
      const auto& toks = plain.out.at(i + 1).tokens;
      std::vector<int32_t> seq = sp[i].prompt;
      seq.insert(seq.end(), toks.begin(), toks.end());
      const int64_t P = int64_t(sp[i].prompt.size());
      const auto f = testing_gpu_runner::gpu_forward_sequence(*gpu, seq, P);
      grammar::Matcher m(sp[i].grammar);
      std::vector<uint32_t> mask(static_cast<size_t>(grammar::mask_words(int32_t(V))));
      for (size_t j = 0; j < toks.size(); ++j) {
        m.fill_mask(mask);
        const float* row = f.logits.data() + (P - 1 + int64_t(j)) * V;
        float a = -std::numeric_limits<float>::infinity(), b = a;
        for (int64_t v = 0; v < V; ++v)
          if ((mask[size_t(v / 32)] >> (v % 32)) & 1u) {
            if (row[v] > a) b = a, a = row[v];
            else if (row[v] > b) b = row[v];
          }
        margin[i + 1].push_back(a - b);
        ASSERT_TRUE(m.accept(toks[j]));
      }
    }
  }
  for (const int32_t running : {1, 2}) {
    const std::string what = "NEXTN 3, max_running " + std::to_string(running);
    const SpecRun spec = run(sp, 3, running);
    expect_structured_valid(t, sp, spec.out, what);
    print_failed_rounds(spec, what);
    for (const auto& [id, o] : plain.out) {
      const auto& got = spec.out.at(id).tokens;
      size_t j = 0;
      while (j < o.tokens.size() && margin[id][j] > kMargin) {
        ASSERT_LT(j, got.size()) << what << ": request " << id << " ended early";
        EXPECT_EQ(got[j], o.tokens[j]) << what << ": request " << id << " token " << j << " (margin " << margin[id][j]
                                       << ")";
        if (got[j] != o.tokens[j]) break;
        ++j;
      }
      if (j == o.tokens.size()) {
        EXPECT_EQ(got.size(), o.tokens.size()) << what << ": request " << id;
      }
      RecordProperty(what + " request " + std::to_string(id) + " compared",
                     std::to_string(j) + " of " + std::to_string(o.tokens.size()));
    }
  }
}
