// The CUDA backend's MTP draft on NVIDIA's checkpoint layout and with grammars (make-synthetic
// glm5-tiny / deepseek-v3-tiny keep the MTP layer's routed experts in BF16, as NVIDIA's NVFP4
// checkpoints do):
//   - RunnerOptions::quantize_mtp_experts (`--speculative-draft-model-quantization nvfp4`): the
//     runner quantizes those experts to NVFP4 at load (the FP4 grouped GEMM path, said in its
//     description), and its MTP logits match the CPU MTP layer run on the same quantized experts
//     (ModelOptions::quantize_mtp_experts: cpu::quantize_experts_nvfp4, the same bytes);
//   - constrained greedy requests (regex, JSON schema, json_object; one unconstrained) through
//     the scheduler with NEXTN (the MTP layer's own drafts, and forced drafts some of which the
//     grammar refuses) give the plain constrained CUDA engine's tokens, up to a near tie.
// Bounds, as gpu_speculative_test's: MTP logits rel L2 <= 5e-2 per row (BF16 activations; up to
// 10 % of the rows may tip on a routing / top-k near tie), greedy equal where the CPU's top-2
// margin > 1e-2. The verify step runs each row as a one-token decode step of a larger batch, so
// its logits equal the plain step's up to the GEMMs' row-count-dependent rounding (rel ~1e-3): a
// constrained token may differ only where the plain run's top-2 margin among the grammar's
// allowed tokens is <= 1e-2; the first difference must be such a near tie, and nothing after it
// is compared (the contexts differ).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_model_backend.hpp"
#include "backend/gpu_mtp_test_util.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "cli/cli_run_helpers.hpp"
#include "engine/scheduler_test_util.hpp"
#include "grammar/grammar.hpp"
#include "gpu_test.hpp"
#include "model/model.hpp"
#include "model/model_test_util.hpp"

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
constexpr int32_t kVocab = 1024, kEosId = 1023, kRefused = 1;  // byte 0x01: no grammar here allows it

const std::string& synthetic(const std::string& preset) {
  return testing_cli::synthetic_model("gpu_mtp_quantized_models", preset);
}

// ---- the MTP layer on quantized experts ----

void quantized_mtp_logits_match(const std::string& preset) {
  const std::string dir = synthetic(preset);
  model::ModelOptions mo;
  mo.threads = 2;
  mo.quantize_mtp_experts = true;
  auto cpu = model::Model::load(dir, mo);
  ASSERT_TRUE(cpu->has_mtp());
  const MoeLayerWeights& cm = cpu->weights().mtp[0].layer.moe;
  ASSERT_TRUE(cm.w13.is_fp4() && cm.w2.is_fp4()) << "the CPU MTP layer's experts were not quantized";
  RunnerOptions ro = small_options();
  ro.mtp = true;
  ro.quantize_mtp_experts = true;
  auto gpu = GpuRunner::load(dir, ro);
  ASSERT_TRUE(gpu->has_mtp());
  EXPECT_NE(gpu->description().find("BF16 routed experts quantized to NVFP4"), std::string::npos) << gpu->description();
  testing_gpu_mtp::expect_mtp_rows_match(testing_gpu_mtp::mtp_rows(*cpu, *gpu, 48, 5),
                                         preset + ", NVFP4 MTP experts");
}

// ---- constrained requests in speculative rounds ----

// The grammar vocabulary over the model's 1024 ids: 0-255 the bytes, 256-1022 two-byte pieces
// of JSON and text (drafts and masks cross token boundaries), 1023 EOS.
const std::vector<std::string>& token_bytes() {
  static const std::vector<std::string> bytes = [] {
    std::vector<std::string> v;
    for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
    for (const char* f : {"{\"", "\":", ",\"", "\"}", "true", "false", "true}", "false}", "{}", "\"n\":", "\"b\":"})
      v.push_back(f);
    const std::string alphabet = "{}[]\":,0123456789abcxyz-. ne";
    for (size_t i = 0; v.size() < size_t(kEosId); ++i)
      v.push_back(std::string(1, alphabet[i % alphabet.size()]) + alphabet[(i / alphabet.size()) % alphabet.size()]);
    v.push_back("");  // kEosId
    return v;
  }();
  return bytes;
}

grammar::Compiler& compiler() {
  static grammar::Compiler c([] {
    grammar::Vocab v;
    v.token_bytes = token_bytes();
    v.vocab_size = kVocab;
    v.stop_ids = {kEosId};
    return v;
  }());
  return c;
}

std::vector<RequestSpec> constrained_specs() {
  const std::vector<grammar::GrammarSpec> gs = {
      {grammar::Kind::kRegex, "[a-c]{3}-[0-9]{2,4}", true},
      {grammar::Kind::kJsonSchema,
       R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":99},)"
       R"("b":{"type":"boolean"}},"required":["n","b"],"additionalProperties":false})",
       true},
      {grammar::Kind::kJsonObject, "", false},
  };
  std::vector<RequestSpec> out;
  for (int i = 0; i < 4; ++i) {
    RequestSpec s;
    for (int j = 0; j < 6 + 7 * i; ++j) s.prompt.push_back((13 + 41 * j + 89 * i) % 1000);
    s.max_new_tokens = 24 + 8 * i;
    s.sampling.temperature = 0.0f;
    if (i < 3) s.grammar = compiler().compile(gs[size_t(i)]);  // request 4: unconstrained, in the same batches
    out.push_back(std::move(s));
  }
  return out;
}

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& specs, int32_t steps, model::DraftOverride drafts = {},
                                SchedulerStats* stats = nullptr) {
  CudaModelBackendOptions o;
  o.model_dir = synthetic("glm5-tiny");
  o.runner = small_options();
  o.runner.max_requests = 4;
  o.runner.max_tokens = 64 + 4;
  o.runner.cuda_graph_max_bs = -1;
  o.runner.poison = false;
  o.runner.quantize_mtp_experts = true;  // the commands' default with NEXTN
  o.speculative_steps = steps;
  o.draft_override = std::move(drafts);
  CudaModelBackend be(o);
  EXPECT_EQ(be.info().speculates_constrained, steps > 0);
  SchedulerConfig c = config(16, 128, 4, 64, 1, true);
  c.eos_ids = {kEosId};
  c.speculative_tokens = steps > 0 ? steps + 1 : 0;
  return run_all(c, specs, be, stats);
}

// The plain run's top-2 margin among the allowed tokens at generated token j of request `spec`
// (teacher-forced runner over prompt + plain tokens; the grammar replayed over the tokens before j).
float masked_margin(GpuRunner& gpu, const RequestSpec& spec, const std::vector<int32_t>& plain, size_t j) {
  std::vector<int32_t> seq = spec.prompt;
  seq.insert(seq.end(), plain.begin(), plain.begin() + std::ptrdiff_t(j) + 1);
  const int64_t P = int64_t(spec.prompt.size()), V = gpu.config().vocab;
  const auto f = testing_gpu_runner::gpu_forward_sequence(gpu, seq, P);
  std::vector<float> row(f.logits.begin() + (P - 1 + int64_t(j)) * V, f.logits.begin() + (P + int64_t(j)) * V);
  if (spec.grammar) {
    grammar::Matcher m(spec.grammar);
    for (size_t i = 0; i < j; ++i) EXPECT_TRUE(m.accept(plain[i]));
    std::vector<uint32_t> mask(size_t(grammar::mask_words(kVocab)));
    m.fill_mask(mask);
    for (int64_t v = 0; v < V; ++v)
      if (!(mask[size_t(v / 32)] >> (v % 32) & 1u)) row[size_t(v)] = -INFINITY;
  }
  return testing_model::top2_margin(row.data(), V);
}

// spec equals plain token for token; where they first differ the plain run's masked margin must
// be a near tie (<= 1e-2), and the rest is not compared. Returns the tokens compared.
size_t expect_same_up_to_a_near_tie(const std::vector<RequestSpec>& specs, const std::map<uint64_t, Outcome>& spec,
                                    const std::map<uint64_t, Outcome>& plain) {
  EXPECT_EQ(spec.size(), plain.size());
  std::unique_ptr<GpuRunner> gpu;
  size_t compared = 0;
  for (const auto& [id, p] : plain) {
    const Outcome& s = spec.at(id);
    EXPECT_TRUE(s.finished) << "request " << id;
    EXPECT_NE(s.reason, FinishReason::kAbort) << "request " << id;
    size_t j = 0;
    while (j < p.tokens.size() && j < s.tokens.size() && s.tokens[j] == p.tokens[j]) ++j;
    compared += j;
    if (j == p.tokens.size() && j == s.tokens.size()) {
      EXPECT_EQ(s.reason, p.reason) << "request " << id;
      continue;
    }
    if (j == p.tokens.size() || j == s.tokens.size()) {
      ADD_FAILURE() << "request " << id << ": " << s.tokens.size() << " tokens with speculation, " << p.tokens.size()
                    << " without, equal up to the shorter";
      continue;
    }
    if (!gpu) gpu = GpuRunner::load(synthetic("glm5-tiny"), small_options());
    const float m = masked_margin(*gpu, specs[size_t(id - 1)], p.tokens, j);
    std::printf("[ info ] request %lu: token %zu differs (%d vs %d), masked margin %.2e\n", (unsigned long)id, j,
                s.tokens[j], p.tokens[j], double(m));
    EXPECT_LE(m, kMargin) << "request " << id << " token " << j << ": not a near tie";
  }
  return compared;
}

}  // namespace

TEST(GpuMtpQuantized, MtpLogitsMatchTheCpuMtpLayerOnTheSameQuantizedExpertsGlm5Tiny) {
  FP4MOE_SKIP_WITHOUT_GPU();
  quantized_mtp_logits_match("glm5-tiny");
}

TEST(GpuMtpQuantized, MtpLogitsMatchTheCpuMtpLayerOnTheSameQuantizedExpertsDeepseekV3Tiny) {
  FP4MOE_SKIP_WITHOUT_GPU();
  quantized_mtp_logits_match("deepseek-v3-tiny");
}

// Kept BF16 (unquant): the runner loads the dense fallback and says nothing of quantizing.
TEST(GpuMtpQuantized, UnquantKeepsTheBf16Experts) {
  FP4MOE_SKIP_WITHOUT_GPU();
  RunnerOptions ro = small_options();
  ro.mtp = true;
  ro.quantize_mtp_experts = false;
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), ro);
  ASSERT_TRUE(gpu->has_mtp());
  EXPECT_EQ(gpu->description().find("quantized to NVFP4"), std::string::npos) << gpu->description();
}

TEST(GpuSpeculativeGrammar, ConstrainedGreedyOutputWithNextnEqualsThePlainConstrainedRun) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::vector<RequestSpec> specs = constrained_specs();
  const auto plain = run(specs, 0);
  size_t total = 0;
  for (const auto& [id, o] : plain) total += o.tokens.size();
  SchedulerStats st;
  const auto own = run(specs, 3, {}, &st);  // the MTP layer's drafts, from masked rows
  EXPECT_GT(st.verify_steps, 0) << "no speculative round ran";
  const size_t c1 = expect_same_up_to_a_near_tie(specs, own, plain);
  // Forced drafts: the plain run's tokens, every fourth one refused by the grammar, every fifth
  // the next id (allowed or not; the target then rejects it).
  const auto forced = run(specs, 3, [&plain](uint64_t id, uint64_t idx, int32_t mtp) {
    const auto& toks = plain.at(id).tokens;
    const int32_t t = idx < toks.size() ? toks[idx] : mtp;
    if (idx % 4 == 3) return kRefused;
    return idx % 5 == 4 ? (t + 1) % kEosId : t;
  });
  const size_t c2 = expect_same_up_to_a_near_tie(specs, forced, plain);
  std::printf("[ info ] constrained NEXTN on cuda: %zu / %zu tokens compared (own drafts), %zu (forced drafts)\n", c1,
              total, c2);
  EXPECT_GT(c1, total / 2);
  EXPECT_GT(c2, total / 2);
}
