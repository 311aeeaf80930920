// Speculative decoding on the CUDA backend (make-synthetic glm5-tiny and deepseek-v3-tiny, one MTP
// layer each; BF16 KV):
//   - the MTP layer on the GPU (GpuRunner::mtp_step) against the CPU's (Model::mtp_step) on the
//     same inputs (the CPU target's final hidden states rounded to BF16, as the GPU keeps them);
//     a draft step's graph replay against eager, bit for bit; `generate --backend cuda
//     --dump-mtp-logits` against the CPU backend's dump;
//   - greedy requests through the engine's scheduler with speculation (the MTP layer's own
//     drafts; forced drafts — the plain run's tokens, every fourth one wrong — for accepts and
//     rejects) against the plain CUDA engine, token for token where the logits margin allows;
//   - a stop id inside an accepted run and max_tokens inside a round end the request there;
//   - seeded sampled requests reproduce their tokens;
//   - the greedy round on the device (GpuRunner::spec_round_greedy via GpuSpecSteps): its tokens
//     and accepted counts equal the host round's exactly (glm5-tiny, deepseek-v3-tiny; N = 1, 3),
//     graph replay equals eager exactly, a stop id inside the accepted run and max_new inside a
//     round end the request there, a mixed batch (a sampled request) keeps the host round, a bad
//     round is one error line before any launch.
// Margin rule (the runner tests'): the verify step runs each row as a one-token decode step of a
// larger batch (backend/decode_rows.hpp), so its logits equal the plain step's up to the GEMMs'
// row-count-dependent rounding (BF16 activations, rel ~1e-3); a greedy token can differ only
// where the target's top-2 logit margin is within that, and 1e-2 is several times it. A request's
// tokens must equal the plain run's up to the first position whose margin (teacher-forced
// runner over the plain tokens) is <= 1e-2; from there it is not compared (its context differs).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/cuda/cuda_model_backend.hpp"
#include "backend/cuda/gpu_spec_steps.hpp"
#include "backend/gpu_mtp_test_util.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "cli/cli_run_helpers.hpp"
#include "engine/scheduler_test_util.hpp"
#include "format/safetensors.hpp"
#include "gpu_test.hpp"
#include "model/model.hpp"
#include "model/model_test_util.hpp"
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

const std::string& synthetic(const std::string& preset) {
  return testing_cli::synthetic_model("gpu_speculative_models", preset);
}

// The MTP logits of every prompt position i < P - 1 (h at i, token i + 1), GPU vs CPU, under
// gpu_mtp_test_util.hpp's bound.
void mtp_logits_match(const std::string& preset) {
  const std::string dir = synthetic(preset);
  model::ModelOptions mo;
  mo.threads = 2;
  auto cpu = model::Model::load(dir, mo);
  ASSERT_TRUE(cpu->has_mtp());
  RunnerOptions ro = small_options();
  ro.mtp = true;
  auto gpu = GpuRunner::load(dir, ro);
  ASSERT_TRUE(gpu->has_mtp());
  testing_gpu_mtp::expect_mtp_rows_match(testing_gpu_mtp::mtp_rows(*cpu, *gpu, 48, 3), preset);
}

// ---- through the engine ----

SchedulerConfig sched(int32_t spec_tokens, int32_t chunk = 64) {
  SchedulerConfig c = config(16, 128, 4, chunk, 1, true);
  c.eos_ids = {};
  c.speculative_tokens = spec_tokens;
  return c;
}

RunnerOptions engine_runner() {
  RunnerOptions o = small_options();
  o.max_requests = 4;
  o.max_tokens = 64 + 4;
  o.cuda_graph_max_bs = -1;  // up to max_requests (x (N + 1) with speculation): verify steps replay graphs
  o.poison = false;
  return o;
}

std::vector<RequestSpec> greedy_specs() {
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 5; ++i) {
    RequestSpec s;
    for (int j = 0; j < 6 + 9 * i; ++j) s.prompt.push_back((11 + 53 * j + 97 * i) % 1024);
    s.sampling.temperature = 0.0f;
    s.max_new_tokens = 9 + 5 * i;
    specs.push_back(s);
  }
  return specs;
}

std::map<uint64_t, Outcome> run(const std::vector<RequestSpec>& specs, int32_t steps,
                                const std::map<uint64_t, Outcome>* drafts_from = nullptr,
                                SchedulerStats* stats = nullptr) {
  CudaModelBackendOptions o;
  o.model_dir = synthetic("glm5-tiny");
  o.runner = engine_runner();
  o.speculative_steps = steps;
  if (drafts_from)
    o.draft_override = [drafts_from](uint64_t id, uint64_t idx, int32_t mtp) {
      const auto& toks = drafts_from->at(id).tokens;
      const int32_t t = idx < toks.size() ? toks[idx] : mtp;
      return idx % 4 == 3 ? (t + 1) % 1024 : t;
    };
  CudaModelBackend be(o);
  return run_all(sched(steps > 0 ? steps + 1 : 0), specs, be, stats);
}

// Per request, the target's top-2 margin at each generated token of `plain` (teacher-forced
// runner over prompt + plain tokens: logits row P - 1 + j decides token j).
std::map<uint64_t, std::vector<float>> margins(const std::vector<RequestSpec>& specs,
                                                const std::map<uint64_t, Outcome>& plain) {
  RunnerOptions ro = small_options();
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), ro);
  const int64_t V = gpu->config().vocab;
  std::map<uint64_t, std::vector<float>> m;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t id = i + 1;
    std::vector<int32_t> seq = specs[i].prompt;
    const auto& toks = plain.at(id).tokens;
    seq.insert(seq.end(), toks.begin(), toks.end());
    const int64_t P = int64_t(specs[i].prompt.size());
    const auto f = testing_gpu_runner::gpu_forward_sequence(*gpu, seq, P);
    for (size_t j = 0; j < toks.size(); ++j)
      m[id].push_back(testing_model::top2_margin(f.logits.data() + (P - 1 + int64_t(j)) * V, V));
  }
  return m;
}

// `spec` equals `plain` token for token up to each request's first near tie (margin <= 1e-2);
// where both run to the end, reasons and lengths too. Returns {tokens compared, tokens in all}.
std::pair<size_t, size_t> expect_same_where_margin_allows(const std::map<uint64_t, Outcome>& spec, const std::map<uint64_t, Outcome>& plain,
                                    const std::map<uint64_t, std::vector<float>>& margin) {
  EXPECT_EQ(spec.size(), plain.size());
  size_t compared = 0, total = 0;
  for (const auto& [id, p] : plain) {
    total += p.tokens.size();
    const Outcome& s = spec.at(id);
    const std::vector<float>& m = margin.at(id);
    size_t tie = p.tokens.size();
    for (size_t j = 0; j < m.size(); ++j)
      if (m[j] <= kMargin) {
        tie = j;
        break;
      }
    const size_t n = std::min({tie + 1, p.tokens.size(), s.tokens.size()});
    compared += std::min(tie, n);
    for (size_t j = 0; j < n; ++j) {
      if (j == tie) break;  // a near tie: either token is the target's
      EXPECT_EQ(s.tokens[j], p.tokens[j]) << "request " << id << " token " << j << " (margin " << m[j] << ")";
    }
    if (tie == p.tokens.size()) {
      EXPECT_EQ(s.tokens, p.tokens) << "request " << id;
      EXPECT_EQ(s.reason, p.reason) << "request " << id;
      EXPECT_EQ(s.matched, p.matched) << "request " << id;
    } else {
      std::printf("[ info ] request %lu: a near tie at token %zu (margin %.2e): compared up to it\n",
                  (unsigned long)id, tie, double(m[tie]));
    }
  }
  return {compared, total};
}

}  // namespace

TEST(GpuMtp, MtpLogitsMatchTheCpuMtpLayerGlm5Tiny) {
  FP4MOE_SKIP_WITHOUT_GPU();
  mtp_logits_match("glm5-tiny");
}

TEST(GpuMtp, MtpLogitsMatchTheCpuMtpLayerDeepseekV3Tiny) {
  FP4MOE_SKIP_WITHOUT_GPU();
  mtp_logits_match("deepseek-v3-tiny");
}

// Draft steps (one token per request, the last of its context) replay the MTP layer's graph of
// their bucket; eager over the same padded batch gives the same logits and states bit for bit.
TEST(GpuMtp, DraftStepGraphReplayEqualsEagerBitForBit) {
  FP4MOE_SKIP_WITHOUT_GPU();
  RunnerOptions ro = small_options();
  ro.mtp = true;
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), ro);
  const int64_t V = gpu->config().vocab, H = gpu->config().hidden, B = 3;
  const auto d = testing_gpu_runner::prefill(*gpu, {20, 7, 33}, 4);  // the target's KV (the MTP's own is zeros)
  std::vector<float> hin(size_t(B * H));
  for (size_t i = 0; i < hin.size(); ++i) hin[i] = float(int64_t(i * 7919 % 2001) - 1000) / 500.0f;
  engine::gpu::MtpStepInput in;
  in.tokens = d.tok.data();
  in.h_in = hin.data();
  in.batch = d.batch();
  in.logits_rows = {0, 1, 2};
  std::vector<float> lg, hg, le, he;
  const int64_t g0 = gpu->stats().graph_steps;
  gpu->mtp_step(in, {&lg, &hg});
  EXPECT_EQ(gpu->stats().graph_steps, g0 + 1) << "a draft step within the buckets replays a graph";
  gpu->set_graphs_enabled(false);
  gpu->mtp_step(in, {&le, &he});
  testing_gpu_runner::expect_bitwise_equal(le, lg, V, "MTP logits");
  ASSERT_EQ(he.size(), hg.size());
  EXPECT_EQ(std::memcmp(he.data(), hg.data(), he.size() * 4), 0) << "MTP output states";
}

// `generate --backend cuda --dump-mtp-logits`: the MTP logits of the prompt's pairs, against the CPU
// backend's dump at the MTP bound above (here the target's hidden states differ too: BF16 on the
// GPU; the same 10 % of rows allowed over it for near ties), with and without speculation.
TEST(GpuMtp, GenerateDumpsTheMtpLogitsOnCudaAsOnCpu) {
  FP4MOE_SKIP_WITHOUT_GPU();
  static testing_cli::TempDir t("gpu_speculative_dump");
  std::string ids;
  for (int i = 0; i < 40; ++i) ids += fmt::format("{}{}", i ? "," : "", (11 + 53 * i) % 1024);
  std::vector<float> cpu_rows;
  for (const std::string backend : {"cpu", "cuda", "cuda --speculative-algorithm NEXTN --speculative-draft-model-quantization unquant"}) {
    const auto f = t.path / "mtp.safetensors";
    const auto r = testing_cli::run_binary(t.path, "generate --model " + synthetic("glm5-tiny") + " --prompt-ids " + ids +
                                                       " --max-new-tokens 4 --dump-mtp-logits " + f.string() +
                                                       " --backend " + backend);
    ASSERT_EQ(r.rc, 0) << backend << ": " << r.err;
    const auto d = SafetensorsFile::open(f.string());
    const TensorInfo& ti = d->get("mtp_logits");
    ASSERT_EQ(ti.shape, (std::vector<int64_t>{39, 1024})) << backend;
    const auto bytes = d->bytes(ti);
    std::vector<float> rows(bytes.size() / 4);
    std::memcpy(rows.data(), bytes.data(), bytes.size());
    if (cpu_rows.empty()) {
      cpu_rows = rows;
      continue;
    }
    int64_t over = 0;
    for (int64_t i = 0; i < 39; ++i) {
      for (int64_t v = 0; v < 1024; ++v) ASSERT_TRUE(std::isfinite(rows[size_t(i * 1024 + v)])) << backend;
      over += testing_model::rel_l2(rows.data() + i * 1024, cpu_rows.data() + i * 1024, 1024) > 5e-2;
    }
    std::printf("[ info ] %s: MTP dump rel L2 %.3e against the cpu backend's, %ld of 39 rows over 5e-2\n",
                backend.c_str(), testing_model::rel_l2(rows.data(), cpu_rows.data(), rows.size()), long(over));
    EXPECT_LE(over, 39 / 10) << backend;
    std::filesystem::remove(f);
  }
}

TEST(GpuMtp, WithoutTheLayerMtpStepIsOneErrorLine) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), small_options());  // RunnerOptions::mtp off
  EXPECT_FALSE(gpu->has_mtp());
  const int32_t tok[1] = {5}, pos[1] = {0}, qo[2] = {0, 1}, len[1] = {1}, pp[2] = {0, 1};
  const std::vector<int32_t> pages = gpu->alloc_pages(1);
  const float h[1] = {0.0f};
  engine::gpu::MtpStepInput in;
  in.tokens = tok;
  in.h_in = h;
  in.batch = {1, 1, qo, pos, len, pp, pages.data()};
  try {
    gpu->mtp_step(in, {});
    ADD_FAILURE() << "mtp_step without the MTP layer ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without the MTP layer"), std::string::npos) << e.what();
  }
  // A checkpoint without an MTP layer: refused at load, one line.
  static testing_cli::TempDir t("gpu_speculative_no_mtp");
  const auto d = t.path / "no-mtp";
  ASSERT_EQ(testing_cli::run_binary(t.path, "make-synthetic " + d.string() + " --preset glm5-tiny --mtp-layers 0").rc, 0);
  RunnerOptions ro = small_options();
  ro.mtp = true;
  try {
    GpuRunner::load(d.string(), ro);
    ADD_FAILURE() << "a checkpoint without an MTP layer loaded with RunnerOptions::mtp";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has none"), std::string::npos) << e.what();
  }
}

TEST(GpuSpeculative, GreedyOutputEqualsPlainGreedyWhereTheMarginAllows) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const auto specs = greedy_specs();
  const auto plain = run(specs, 0);
  const auto m = margins(specs, plain);
  for (int32_t n : {1, 3}) {
    SchedulerStats st;
    const auto own = run(specs, n, nullptr, &st);  // the MTP layer's own drafts (mostly rejected)
    const auto [c0, t0] = expect_same_where_margin_allows(own, plain, m);
    EXPECT_GE(2 * c0, t0) << "N " << n << ": fewer than half the tokens before a near tie";
    EXPECT_GT(st.verify_steps, 0);
    const auto forced = run(specs, n, &plain, &st);  // accepts and rejects
    const auto [c1, t1] = expect_same_where_margin_allows(forced, plain, m);
    EXPECT_GE(2 * c1, t1) << "N " << n << ": fewer than half the tokens before a near tie";
    int64_t tokens = 0, verify = 0;
    for (const auto& [id, o] : forced) tokens += o.usage.completion_tokens, verify += o.usage.spec_verify_steps;
    if (n == 3) {
      EXPECT_LT(verify, tokens / 2) << "forced drafts: most rounds emit several tokens";
    }
  }
}

TEST(GpuSpeculative, AStopIdInsideAnAcceptedRunAndMaxTokensInsideARoundEndTheRequestThere) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto specs = greedy_specs();
  const auto plain0 = run(specs, 0);
  const auto& toks = plain0.at(1).tokens;
  size_t k = 6;  // output index 6: the middle of the second 4-token round
  while (std::find(toks.begin(), toks.begin() + int64_t(k), toks[k]) != toks.begin() + int64_t(k)) ++k;
  specs[0].stop_ids = {toks[k]};
  specs[1].max_new_tokens = 7;  // the second round cut to 2 tokens
  const auto plain = run(specs, 0);
  ASSERT_EQ(plain.at(1).tokens.size(), k + 1);
  ASSERT_EQ(plain.at(1).reason, FinishReason::kStop);
  const auto spec = run(specs, 3, &plain0);
  const auto m = margins(specs, plain);
  expect_same_where_margin_allows(spec, plain, m);
  auto clear = [&](uint64_t id) {  // no near tie in the request's tokens: its end is comparable
    for (float x : m.at(id))
      if (x <= kMargin) return false;
    return true;
  };
  int checked = 0;
  if (clear(1)) {
    ++checked;
    EXPECT_EQ(spec.at(1).tokens.size(), k + 1);
    EXPECT_EQ(spec.at(1).reason, FinishReason::kStop);
    EXPECT_EQ(spec.at(1).matched, toks[k]);
  }
  if (clear(2)) {
    ++checked;
    EXPECT_EQ(spec.at(2).tokens.size(), 7u);
  }
  EXPECT_GE(checked, 1) << "near ties in both requests: the stop / max_tokens ends were not compared";
}

TEST(GpuSpeculative, SeededSampledRequestsReproduceTheirTokens) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto specs = greedy_specs();
  for (auto& s : specs) {
    s.sampling.temperature = 0.9f;
    s.sampling.top_k = 40;
    s.sampling.seed = 1234 + s.prompt.size();
    s.sampling.has_seed = true;
  }
  const auto a = run(specs, 3), b = run(specs, 3);
  for (const auto& [id, o] : a) {
    EXPECT_EQ(o.tokens, b.at(id).tokens) << "request " << id;
    EXPECT_EQ(o.usage.completion_tokens, specs[id - 1].max_new_tokens) << "request " << id;
  }
}

// ---- the greedy round on the device (GpuRunner::spec_round_greedy through GpuSpecSteps) ----
// MtpSpeculator over GpuSpecSteps with device rounds on and off, on the same runner: prefill each
// request alone (its first token: the argmax of its last row), then rounds over the running batch.
// Device and host rounds run the same batches through the same graphs (draft steps, verify, and the
// MTP catch-up over every verify row: GpuSpecSteps::catchup_over_verify_rows on the host path), so
// they agree exactly: the same tokens, the same accepted counts, round by round.
namespace {

struct SpecReq {
  std::vector<int32_t> prompt;
  int32_t max_new = 16;
  std::vector<int32_t> stops;
  cpu::SamplingParams sampling;
};

struct SpecRun {
  std::map<uint64_t, Outcome> out;  // tokens only (reason kStop on a stop id)
  std::vector<int32_t> accepted;    // per round and request, in order
  int64_t device_rounds = 0, host_rounds = 0;
  int64_t greedy_batches = 0, mixed_batches = 0;  // rounds whose batch was all device_round_eligible, or not
};

RunnerOptions round_runner() {
  RunnerOptions o = small_options();
  o.mtp = true;
  o.max_requests = 16;     // verify rows: 3 requests x (N + 1)
  o.cuda_graph_max_bs = 16;
  return o;
}

SpecRun drive_gpu(GpuRunner& gpu, const std::vector<SpecReq>& reqs, int32_t N, bool device) {
  engine::gpu::GpuSpecSteps steps(gpu);
  steps.device_rounds = device;
  model::MtpSpeculator spec(steps, N);
  const int64_t V = gpu.config().vocab, ps = gpu.page_size();
  const size_t R = reqs.size();
  std::vector<std::vector<int32_t>> pages(R), gen(R);
  std::vector<bool> done(R, false);
  SpecRun run;
  for (size_t r = 0; r < R; ++r) {
    const auto& p = reqs[r].prompt;
    const int32_t P = int32_t(p.size());
    pages[r] = gpu.alloc_pages((P + reqs[r].max_new + N + 1 + ps - 1) / ps);
    std::vector<int32_t> pos(p.size());
    for (int32_t i = 0; i < P; ++i) pos[size_t(i)] = i;
    const int32_t qo[2] = {0, P}, len[1] = {P}, pp[2] = {0, int32_t(pages[r].size())};
    engine::gpu::StepInput in;
    in.tokens = p.data();
    in.batch = {1, P, qo, pos.data(), len, pp, pages[r].data()};
    in.logits_rows = {P - 1};
    std::vector<float> logits, hidden;
    engine::gpu::StepOutput o;
    o.logits = &logits;
    o.final_hidden = &hidden;
    gpu.step(in, o);
    const int32_t t0 = cpu::sample_cpu(logits.data(), V, reqs[r].sampling, p, {}, 0).token;
    gen[r].push_back(t0);
    done[r] = reqs[r].max_new == 1 || std::count(reqs[r].stops.begin(), reqs[r].stops.end(), t0) > 0;
    spec.add_target_rows(r + 1, 0, p, hidden.data(), t0, pages[r]);
  }
  spec.run_queued();
  for (int guard = 0; guard < 200; ++guard) {
    std::vector<model::SpecRequest> batch;
    std::vector<size_t> who;
    for (size_t r = 0; r < R; ++r) {
      if (done[r]) continue;
      model::SpecRequest q;
      q.id = r + 1;
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
    const bool all = std::all_of(batch.begin(), batch.end(), [](const model::SpecRequest& q) {
      return model::device_round_eligible(q);
    });
    (all ? run.greedy_batches : run.mixed_batches) += 1;
    const auto res = spec.round(batch);
    for (size_t i = 0; i < who.size(); ++i) {
      const size_t r = who[i];
      run.accepted.push_back(res[i].accepted);
      for (const auto& t : res[i].tokens) {
        gen[r].push_back(t.token);
        if (std::count(reqs[r].stops.begin(), reqs[r].stops.end(), t.token) > 0) done[r] = true;
      }
      if (int32_t(gen[r].size()) >= reqs[r].max_new) done[r] = true;
    }
  }
  for (size_t r = 0; r < R; ++r) {
    Outcome& o = run.out[r + 1];
    o.tokens = gen[r];
    const bool stopped = std::count(reqs[r].stops.begin(), reqs[r].stops.end(), gen[r].back()) > 0;
    o.reason = stopped ? FinishReason::kStop : FinishReason::kLength;
    gpu.release_pages(pages[r]);
  }
  run.device_rounds = spec.device_round_count;
  run.host_rounds = spec.host_round_count;
  EXPECT_EQ(steps.device_round_steps, run.device_rounds);
  return run;
}

std::vector<SpecReq> round_reqs(int64_t V) {
  std::vector<SpecReq> r(3);
  r[0].prompt = testing_gpu_runner::prompt_of(6, V, 1);
  r[1].prompt = testing_gpu_runner::prompt_of(33, V, 2);
  r[2].prompt = testing_gpu_runner::prompt_of(17, V, 3);
  r[1].max_new = 11;
  for (auto& q : r) q.sampling.temperature = 0.0f;
  return r;
}

void device_round_equals_host_round(const std::string& preset) {
  auto gpu = GpuRunner::load(synthetic(preset), round_runner());
  const auto reqs = round_reqs(gpu->config().vocab);
  for (int32_t N : {1, 3}) {
    const SpecRun host = drive_gpu(*gpu, reqs, N, false), dev = drive_gpu(*gpu, reqs, N, true);
    EXPECT_EQ(host.device_rounds, 0);
    EXPECT_GT(host.host_rounds, 0);
    EXPECT_GT(dev.device_rounds, 0) << "N " << N;
    EXPECT_EQ(dev.host_rounds, 0) << "N " << N << ": every batch is greedy";
    for (const auto& [id, o] : host.out) EXPECT_EQ(dev.out.at(id).tokens, o.tokens) << preset << " N " << N << " request " << id;
    EXPECT_EQ(dev.accepted, host.accepted) << preset << " N " << N << ": accepted drafts per round";
    int64_t acc = 0;
    for (int32_t a : dev.accepted) acc += a;
    std::printf("[ info ] %s N %d: %ld device rounds, %ld drafts accepted\n", preset.c_str(), N,
                long(dev.device_rounds), long(acc));
  }
}

}  // namespace

TEST(GpuSpecRound, DeviceRoundEqualsHostRoundTokenForTokenGlm5Tiny) {
  FP4MOE_SKIP_WITHOUT_GPU();
  device_round_equals_host_round("glm5-tiny");
}

TEST(GpuSpecRound, DeviceRoundEqualsHostRoundTokenForTokenDeepseekV3Tiny) {
  FP4MOE_SKIP_WITHOUT_GPU();
  device_round_equals_host_round("deepseek-v3-tiny");
}

// Graph replay (draft steps, verify and catch-up in their buckets) vs eager over the same padded
// batches: the same computations, so the same tokens and accept counts exactly.
TEST(GpuSpecRound, GraphReplayEqualsEager) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), round_runner());
  const auto reqs = round_reqs(gpu->config().vocab);
  const int64_t g0 = gpu->stats().graph_steps;
  const SpecRun graph = drive_gpu(*gpu, reqs, 3, true);
  EXPECT_GE(gpu->stats().graph_steps, g0 + 2 * graph.device_rounds) << "verify and catch-up (and draft steps) replay graphs";
  gpu->set_graphs_enabled(false);
  const int64_t e0 = gpu->stats().eager_steps;
  const SpecRun eager = drive_gpu(*gpu, reqs, 3, true);
  EXPECT_GT(gpu->stats().eager_steps, e0);
  for (const auto& [id, o] : graph.out) EXPECT_EQ(eager.out.at(id).tokens, o.tokens) << "request " << id;
  EXPECT_EQ(eager.accepted, graph.accepted);
}

TEST(GpuSpecRound, AStopIdInsideTheAcceptedRunAndMaxNewInsideARoundEndTheRequestThere) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), round_runner());
  auto reqs = round_reqs(gpu->config().vocab);
  const SpecRun plain = drive_gpu(*gpu, reqs, 3, false);
  const auto& toks = plain.out.at(1).tokens;
  size_t k = 6;  // inside the second round of up to 4 tokens
  while (std::find(toks.begin(), toks.begin() + int64_t(k), toks[k]) != toks.begin() + int64_t(k)) ++k;
  reqs[0].stops = {toks[k]};
  reqs[1].max_new = 6;
  const SpecRun host = drive_gpu(*gpu, reqs, 3, false), dev = drive_gpu(*gpu, reqs, 3, true);
  EXPECT_GT(dev.device_rounds, 0);
  for (const auto& [id, o] : host.out) EXPECT_EQ(dev.out.at(id).tokens, o.tokens) << "request " << id;
  EXPECT_EQ(dev.accepted, host.accepted);
  // The stop id ends request 1 at its first occurrence (the same run up to there), max_new request 2.
  EXPECT_EQ(dev.out.at(1).tokens, std::vector<int32_t>(toks.begin(), toks.begin() + int64_t(k) + 1));
  EXPECT_EQ(dev.out.at(1).reason, FinishReason::kStop);
  EXPECT_EQ(dev.out.at(2).tokens.size(), 6u);
}

// Batches with a request the device round cannot take (sampled, penalties, logprobs) keep the host
// round: every request ineligible, then a batch mixed while the sampled request runs and
// greedy-only after it (device rounds exactly for the greedy-only batches); the same tokens as
// the host rounds alone, exactly.
TEST(GpuSpecRound, AMixedBatchKeepsTheHostRound) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), round_runner());
  auto reqs = round_reqs(gpu->config().vocab);
  reqs[1].sampling.temperature = 0.8f;
  reqs[1].sampling.seed = 77;
  reqs[1].sampling.has_seed = true;
  reqs[0].sampling.repetition_penalty = 1.3f;
  reqs[2].sampling.logprobs_top_n = 0;
  const SpecRun host = drive_gpu(*gpu, reqs, 3, false), dev = drive_gpu(*gpu, reqs, 3, true);
  EXPECT_EQ(dev.device_rounds, 0);
  EXPECT_EQ(dev.host_rounds, dev.mixed_batches);
  for (const auto& [id, o] : host.out) EXPECT_EQ(dev.out.at(id).tokens, o.tokens) << "request " << id;

  reqs[0].sampling.repetition_penalty = 1.0f;
  reqs[2].sampling.logprobs_top_n = -1;
  reqs[0].max_new = 28;
  reqs[1].max_new = 8;
  const SpecRun host2 = drive_gpu(*gpu, reqs, 3, false), dev2 = drive_gpu(*gpu, reqs, 3, true);
  EXPECT_EQ(dev2.device_rounds, dev2.greedy_batches);
  EXPECT_EQ(dev2.host_rounds, dev2.mixed_batches);
  EXPECT_GT(dev2.mixed_batches, 0);
  for (const auto& [id, o] : host2.out) EXPECT_EQ(dev2.out.at(id).tokens, o.tokens) << "request " << id;
  EXPECT_EQ(dev2.accepted, host2.accepted);
}

TEST(GpuSpecRound, ABadRoundIsOneErrorLineBeforeAnyLaunch) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = GpuRunner::load(synthetic("glm5-tiny"), round_runner());
  const std::vector<int32_t> pages = gpu->alloc_pages(2);
  engine::gpu::GreedyRoundInput in;
  in.max_drafts = 3;
  in.start = {10};
  in.last_token = {5};
  in.first_draft = {6};
  in.num_drafts = {3};
  in.max_new = {3};  // 3 drafts need max_new >= 4
  in.pages = {pages};
  std::vector<float> h(size_t(gpu->config().hidden), 0.0f);
  in.draft_hidden = h.data();
  engine::gpu::GreedyRoundOutput out;
  const int64_t steps = gpu->stats().graph_steps + gpu->stats().eager_steps;
  try {
    gpu->spec_round_greedy(in, out);
    ADD_FAILURE() << "a round of 3 drafts with max_new 3 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("drafts"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpu->stats().graph_steps + gpu->stats().eager_steps, steps);
  gpu->release_pages(pages);
}
