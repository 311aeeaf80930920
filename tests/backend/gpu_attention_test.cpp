// The GPU runner's fast attention path (cuda/attention's MlaDecodeMma with a device-built split
// schedule, RunnerOptions::attention_kernels = Auto) against its own any-dims kernels (Own), on
// make-synthetic models with real attention dims and tiny everything else:
//   glm5-attn-tiny        64 heads, kv_lora 512, rope 64, DSA top-64 in both layers (sparse rows,
//                         prefill and decode);
//   deepseek-v3-attn-tiny 128 heads, no indexer (dense decode through the page tables, prefill
//                         on the own kernel);
//   the same at 64 heads  (make-synthetic --heads 64): dense decode, and on sm_90 the prefill
//                         steps on FlashInfer's MlaSm90 (enabled for 64 heads only).
// Checked:
//   - the path taken: fast at these dims, own for the tiny goldens' dims and when forced (the
//     fast path writes GLM-5's index keys with cuda/indexer's fused LayerNorm + RoPE + append,
//     so the per-layer comparison below covers it against the runner's unfused kernels);
//   - per layer hidden states and logits, fast vs own, over a 100-token prefill + 16 decode
//     steps (eager with per-layer outputs, then the same decode step replayed from its graph),
//     within a bound derived from BF16 rounding (below), wherever both runs made the same
//     discrete choices (DSA top-k, MoE experts; a near-tie broken differently is O(1));
//   - graph replay = eager over the same padded batch, bit for bit, with the fast path (contexts
//     from 1 to 200 in one bucket, split and unsplit rows);
//   - a batch of requests of lengths 3, 40 and 180 (decode graphs captured for max_context 256,
//     so most rows are far shorter than the captured grid) = each request alone.
// The same with RunnerOptions::attention_kernels = FlashInferDecode (parameters "+fi", sm_90,
// 64 heads): decode and top-k rows on FlashInfer's kernel over MlaSm90::run_device's schedule; and
// with Auto ("+auto"): that, but a one-token step takes its top-k rows to MlaDecodeMma. "+fp8":
// the same with both runners' caches in FP8 E4M3 (issue 40: the FP8 decode kernels, FP8 indexer
// scores, FP8 fused key writes; compiled, not run yet). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "cuda/attention/mla.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "gpu_test.hpp"
#include "model/model_test_util.hpp"

namespace fp4moe {
namespace {

using engine::gpu::AttentionKernels;
using engine::gpu::GpuRunner;
using engine::gpu::RunnerOptions;
using engine::gpu::StepChoices;
using engine::gpu::StepInput;
using engine::gpu::StepOutput;
using testing_gpu_runner::prompt_of;
using testing_gpu_runner::small_options;
using testing_model::rel_l2;

constexpr int64_t kPage = 16;  // small_options().page_size
// BF16 unit roundoff. Per layer, the two attention kernels differ by: P rounded to BF16 before
// P·V (fast; <= u per weight), the BF16 output rounded from a different FP32 value (<= 2u, one
// ulp), and the W_UV / o_proj outputs then rounding to a neighbouring BF16 (<= u): <= 4u of the
// attention branch, which is at most the whole hidden state; added layer by layer.
constexpr double kU = 1.0 / 256.0;
double layer_bound(int64_t layers_done) { return 4.0 * kU * double(std::max<int64_t>(layers_done, 1)); }
// FP8 KV ("+fp8"): both runs read E4M3 caches, but the own path rounds the latent to BF16 first
// (RMSNorm's output) and then to E4M3, the fast path (kv_latent_prep) FP32 straight to E4M3. BF16
// moves a value by <= 2^-9 of it, E4M3's rounding midpoints lie 2^-3 of it apart: <= 2^-6 of the
// codes differ, each by one E4M3 step (<= 2^-3): the keys differ by <= sqrt(2^-6) * 2^-3 = 2^-6
// rel L2, which bounds what each layer's attention branch adds on top of the BF16 terms.
constexpr double kFp8Keys = 1.0 / 64.0;
double layer_bound(int64_t layers_done, bool fp8) {
  return layer_bound(layers_done) + (fp8 ? kFp8Keys * double(std::max<int64_t>(layers_done, 1)) : 0.0);
}

// A model name: "<preset>" or "<preset>@<heads>" (make-synthetic --heads).
std::string synthetic_dir(const std::string& model) {
  static std::map<std::string, std::string> made;
  static testing_cli::TempDir tmp("gpu_attention_models");
  if (auto it = made.find(model); it != made.end()) return it->second;
  const size_t at = model.find('@');
  const bool override_heads = at != std::string::npos;
  const std::string preset = model.substr(0, at), heads = override_heads ? model.substr(at + 1) : "";
  const std::string out = (tmp.path / (override_heads ? preset + "_h" + heads : preset)).string();
  const std::string args = "make-synthetic " + out + " --preset " + preset + (override_heads ? " --heads " + heads : "");
  const auto r = testing_cli::run_binary(tmp.path, args);
  EXPECT_EQ(r.rc, 0) << r.err;
  return made[model] = out;
}

RunnerOptions options(AttentionKernels k, bool fp8 = false) {
  RunnerOptions o = small_options();
  o.max_tokens = 256;  // one prefill step of 223 tokens (BatchOfDifferentLengths...)
  o.attention_kernels = k;
  if (fp8) o.kv_elem = KvElem::FP8_E4M3;  // --kv-cache-dtype fp8_e4m3 (issue 40)
  return o;
}

// A test parameter: "<model>" (MmaDecode: MlaDecodeMma), "<model>+fi" (FlashInferDecode: FlashInfer's
// kernel over the device-built schedule, sm_90 and 64 heads), "<model>+auto" (Auto there: FlashInfer,
// but the top-k rows of one-token steps on MlaDecodeMma, so a request alone and the same request
// in a batch take different kernels), "<model>+wg" (WgmmaDecode: MlaDecodeMma's wgmma variant, sm_90) or
// "<model>+ws+fp8" (WgmmaWsDecode: its warp-specialized variant, sm_90, FP8 cache only).
std::string model_of(const std::string& param) { return param.substr(0, param.find('+')); }
bool flashinfer_of(const std::string& param) { return param.find("+fi") != std::string::npos; }
bool wgmma_of(const std::string& param) { return param.find("+wg") != std::string::npos; }
bool auto_of(const std::string& param) { return param.find("+auto") != std::string::npos; }
bool wgmma_ws_of(const std::string& param) { return param.find("+ws") != std::string::npos; }
// "+fp8" (with any of the above): both runners keep an FP8 E4M3 cache (--kv-cache-dtype fp8_e4m3):
// the fast path's FP8 decode kernels, FP8 indexer scores (queries quantized) and FP8 fused writes.
bool fp8_of(const std::string& param) { return param.find("+fp8") != std::string::npos; }

// Loads the model with the fast path; null when this GPU cannot run it (the line says why).
std::unique_ptr<GpuRunner> load_fast(const std::string& param) {
  if (flashinfer_of(param)) {
    if (cuda::attention::current_device_sm() != 90) return nullptr;
    auto g = GpuRunner::load(synthetic_dir(model_of(param)), options(AttentionKernels::FlashInferDecode, fp8_of(param)));
    EXPECT_NE(g->attention_line().find("MlaSm90::run_device"), std::string::npos) << g->attention_line();
    return g;
  }
  if (auto_of(param)) {
    if (cuda::attention::current_device_sm() != 90) return nullptr;
    auto g = GpuRunner::load(synthetic_dir(model_of(param)), options(AttentionKernels::Auto, fp8_of(param)));
    EXPECT_NE(g->attention_line().find("MlaSm90::run_device"), std::string::npos) << g->attention_line();
    EXPECT_NE(g->attention_line().find("one-token steps: MlaDecodeMma"), std::string::npos) << g->attention_line();
    return g;
  }
  if (wgmma_of(param)) {
    if (cuda::attention::current_device_sm() != 90) return nullptr;
    auto g = GpuRunner::load(synthetic_dir(model_of(param)), options(AttentionKernels::WgmmaDecode, fp8_of(param)));
    EXPECT_NE(g->attention_line().find("MlaDecodeMma (wgmma"), std::string::npos) << g->attention_line();
    return g;
  }
  if (wgmma_ws_of(param)) {
    if (cuda::attention::current_device_sm() != 90) return nullptr;
    auto g = GpuRunner::load(synthetic_dir(model_of(param)), options(AttentionKernels::WgmmaWsDecode, fp8_of(param)));
    EXPECT_NE(g->attention_line().find("MlaDecodeMma (warp-specialized wgmma"), std::string::npos)
        << g->attention_line();
    return g;
  }
  // mma-decode where MlaDecodeMma cannot run is refused in one line (tuner/attention_plan.hpp).
  std::unique_ptr<GpuRunner> g;
  try {
    g = GpuRunner::load(synthetic_dir(model_of(param)), options(AttentionKernels::MmaDecode, fp8_of(param)));
  } catch (const Error& e) {
    if (std::string(e.what()).rfind("--attention-kernels mma-decode: ", 0) == 0) return nullptr;
    throw;
  }
  EXPECT_NE(g->attention_line().find("MlaDecodeMma"), std::string::npos) << g->attention_line();
  return g;
}

class FastAttention : public ::testing::TestWithParam<std::string> {};

TEST(GpuAttentionPath, KernelChoiceNamesParseAndOthersAreAnError) {  // no GPU needed
  EXPECT_EQ(engine::gpu::parse_attention_kernels("auto"), AttentionKernels::Auto);
  EXPECT_EQ(engine::gpu::parse_attention_kernels("own"), AttentionKernels::Own);
  EXPECT_EQ(engine::gpu::parse_attention_kernels("flashinfer-decode"), AttentionKernels::FlashInferDecode);
  EXPECT_EQ(engine::gpu::parse_attention_kernels("mma-decode"), AttentionKernels::MmaDecode);
  EXPECT_EQ(engine::gpu::parse_attention_kernels("wgmma-decode"), AttentionKernels::WgmmaDecode);
  EXPECT_THROW(engine::gpu::parse_attention_kernels("wgmma"), Error);
  EXPECT_THROW(engine::gpu::parse_attention_kernels(""), Error);
}

TEST(GpuAttentionPath, AutoPicksFlashInferOnSm90With64HeadsElseMmaOwnForTinyDimsOrWhenForced) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (const char* preset : {"glm5-attn-tiny", "deepseek-v3-attn-tiny", "deepseek-v3-attn-tiny@64"}) {
    auto own = GpuRunner::load(synthetic_dir(preset), options(AttentionKernels::Own));
    EXPECT_FALSE(own->fast_attention()) << own->attention_line();
    auto fast = GpuRunner::load(synthetic_dir(preset), options(AttentionKernels::Auto));
    std::printf("[ info ] %s: %s\n", preset, fast->attention_line().c_str());
    if (!fast->fast_attention()) GTEST_SKIP() << "the fast attention path does not run on this GPU";
    // Auto: FlashInfer's decode over the device schedule on sm_90 with 64 heads, else MlaDecodeMma.
    const bool fi = cuda::attention::current_device_sm() == 90 && fast->config().num_heads == 64;
    EXPECT_NE(fast->attention_line().find(fi ? "MlaSm90::run_device" : "MlaDecodeMma"), std::string::npos)
        << fast->attention_line();
    const model::MlaModelConfig& mc = fast->config();
    if (mc.index_n_heads == 32 && mc.index_head_dim == 128) {  // GLM-5's indexer: the fused index-key write
      EXPECT_NE(fast->attention_line().find("fused LayerNorm + RoPE + cache write"), std::string::npos)
          << fast->attention_line();
    }
    if (mc.kv_lora_rank == 512 && mc.qk_rope_dim == 64 &&
        (!mc.has_indexer() || (mc.index_n_heads == 32 && mc.index_head_dim == 128))) {  // every key fused
      EXPECT_NE(fast->attention_line().find("fused RMSNorm + RoPE + cache write"), std::string::npos)
          << fast->attention_line();
    }
    if (fast->config().num_heads != 64) {  // FlashInfer's prefill is enabled for 64 heads only
      EXPECT_EQ(fast->attention_line().find("MlaSm90, causal"), std::string::npos) << fast->attention_line();
    }
  }
  auto tiny = GpuRunner::load(testing_gpu_runner::model_dir({"glm5-tiny-sparse", "bf16"}), small_options());
  EXPECT_FALSE(tiny->fast_attention()) << tiny->attention_line();
  EXPECT_NE(tiny->attention_line().find("kv_lora_rank"), std::string::npos) << tiny->attention_line();
}

// The first layer whose discrete choices differ between two runs of one step (num_layers: none).
int64_t first_choice_diff(const StepChoices& a, const StepChoices& b, int64_t layers) {
  for (int64_t l = 0; l < layers; ++l)
    if (a.topk_positions[size_t(l)] != b.topk_positions[size_t(l)] || a.expert_ids[size_t(l)] != b.expert_ids[size_t(l)])
      return l;
  return layers;
}

TEST_P(FastAttention, MatchesOwnKernelsPerLayerOverPrefillAndDecodeGraphsAndEager) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto fast = load_fast(GetParam());
  if (!fast) GTEST_SKIP() << "the fast attention path does not run on this GPU";
  const bool fp8 = fp8_of(GetParam());
  auto own = GpuRunner::load(synthetic_dir(model_of(GetParam())), options(AttentionKernels::Own, fp8));
  const int64_t V = fast->config().vocab, NL = fast->config().num_layers, n = 100, steps = 16;
  std::vector<int32_t> seq = prompt_of(n, V, 11);
  const std::vector<int32_t> tf = fast->alloc_pages((n + steps + kPage - 1) / kPage),
                             to = own->alloc_pages((n + steps + kPage - 1) / kPage);
  int compared = 0, full = 0;
  for (int64_t s = 0; s <= steps; ++s) {
    const int64_t len = int64_t(seq.size()), from = s == 0 ? 0 : len - 1, T = len - from;
    std::vector<int32_t> pos;
    for (int64_t p = from; p < len; ++p) pos.push_back(int32_t(p));
    const int32_t qo[2] = {0, int32_t(T)}, kl[1] = {int32_t(len)};
    SCOPED_TRACE(testing::Message() << GetParam() << " step " << s);
    auto run = [&](GpuRunner& g, const std::vector<int32_t>& table, bool per_layer, std::vector<float>& logits,
                   model::HiddenStates& hid, StepChoices& ch, std::vector<int32_t>& greedy) {
      const int32_t pp[2] = {0, int32_t(table.size())};
      StepInput in;
      in.tokens = seq.data() + from;
      in.batch = {1, T, qo, pos.data(), kl, pp, table.data()};
      in.logits_rows = {int32_t(T - 1)};
      StepOutput o;
      o.logits = &logits;
      o.greedy = &greedy;
      if (per_layer) o.hidden = &hid, o.choices = &ch;
      g.step(in, o);
    };
    std::vector<float> lf, lo;
    model::HiddenStates hf, ho;
    StepChoices cf, co;
    std::vector<int32_t> gf, go;
    run(*fast, tf, true, lf, hf, cf, gf);
    run(*own, to, true, lo, ho, co, go);
    ASSERT_EQ(hf.size(), size_t(NL + 1));
    ASSERT_EQ(ho.size(), hf.size());
    const int64_t diff = first_choice_diff(cf, co, NL);
    // hidden[i] is after layer i - 1 (hidden[0] the embedding, hidden[NL] the final norm): those
    // up to the first layer with other choices saw the same discrete decisions.
    for (int64_t i = 0; i <= std::min(diff, NL); ++i) {
      const double e = rel_l2(hf[size_t(i)].data(), ho[size_t(i)].data(), hf[size_t(i)].size());
      EXPECT_LE(e, layer_bound(i, fp8)) << "hidden state after layer " << i - 1;
      ++compared;
    }
    if (diff == NL) {
      ++full;
      EXPECT_LE(rel_l2(lf.data(), lo.data(), size_t(V)), layer_bound(NL + 1, fp8)) << "logits (eager)";
    } else {
      std::printf("[ info ] %s step %lld: layer %lld's choices differ (a near-tie); later layers not compared\n",
                  GetParam().c_str(), static_cast<long long>(s), static_cast<long long>(diff));
    }
    if (s > 0) {  // the same decode step again, replayed from its graph (rewrites this position's keys,
                  // equal up to rounding: the captured split grid differs from the eager one's)
      std::vector<float> gl_f, gl_o;
      model::HiddenStates unused;
      StepChoices unused_c;
      std::vector<int32_t> g1, g2;
      const int64_t g0f = fast->stats().graph_steps;
      run(*fast, tf, false, gl_f, unused, unused_c, g1);
      run(*own, to, false, gl_o, unused, unused_c, g2);
      EXPECT_EQ(fast->stats().graph_steps, g0f + 1) << "the decode step did not replay a graph";
      if (diff == NL) {
        EXPECT_LE(rel_l2(gl_f.data(), gl_o.data(), size_t(V)), layer_bound(NL + 1, fp8)) << "logits (graph)";
      }
    }
    seq.push_back(gf[0]);  // both runners follow the fast run's tokens
  }
  std::printf("[ info ] %s: %d hidden states compared, %d of %lld steps with identical choices throughout\n",
              GetParam().c_str(), compared, full, static_cast<long long>(steps + 1));
  // FP8 with an indexer: the fast path scores with FP8 queries (quantize_q_fp8), the own kernel
  // with BF16 ones, so their top-k sets differ wherever a key sits near the cut (the FP8 noise the
  // issue accepts): the layers before the first difference are compared, the count is printed.
  if (!(fp8 && fast->config().has_indexer()))
    EXPECT_GE(full, int(steps + 1) / 2) << "too few steps made the same discrete choices to compare the logits";
  fast->release_pages(tf);
  own->release_pages(to);
}

// Decode steps of 3 (bucket 4: a padding row) and 8 requests with contexts 1 .. 200: graph
// replay = eager over the same padded batch, bit for bit.
TEST_P(FastAttention, GraphReplayEqualsEagerBitForBit) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = load_fast(GetParam());
  if (!gpu) GTEST_SKIP() << "the fast attention path does not run on this GPU";
  const int64_t V = gpu->config().vocab;
  for (int64_t R : {3, 8}) {
    std::vector<int64_t> lens;
    for (int64_t r = 0; r < R; ++r) lens.push_back(r == 0 ? 1 : r == 1 ? 200 : 9 + 23 * r);
    testing_gpu_runner::Decoding d = testing_gpu_runner::prefill(*gpu, lens, 1);
    StepInput in;
    in.tokens = d.tok.data();
    in.batch = d.batch();
    for (int64_t r = 0; r < R; ++r) in.logits_rows.push_back(int32_t(r));
    std::vector<float> eager, graph;
    gpu->set_graphs_enabled(false);
    gpu->step(in, {&eager, nullptr, nullptr});
    gpu->set_graphs_enabled(true);
    const int64_t g0 = gpu->stats().graph_steps;
    gpu->step(in, {&graph, nullptr, nullptr});
    EXPECT_EQ(gpu->stats().graph_steps, g0 + 1) << "the decode step did not replay a graph";
    testing_gpu_runner::expect_bitwise_equal(eager, graph, V, "R " + std::to_string(R));
    d.release(*gpu);
  }
}

// Requests of lengths 3, 40 and 180 prefilled in ONE step, then 8 decode steps together (the
// bucket-4 graph, captured for max_context 256): each request's greedy tokens and logits = the
// request alone (single-request prefill, then the bucket-1 graph).
TEST_P(FastAttention, BatchOfDifferentLengthsEqualsEachRequestAlone) {
  FP4MOE_SKIP_WITHOUT_GPU();
  auto gpu = load_fast(GetParam());
  if (!gpu) GTEST_SKIP() << "the fast attention path does not run on this GPU";
  const int64_t steps = 8;
  EXPECT_EQ(testing_gpu_runner::expect_batch_equals_alone(*gpu, {3, 40, 180}, steps, 21), steps)
      << "the batched decode steps did not replay graphs";
}

INSTANTIATE_TEST_SUITE_P(RealAttentionDims, FastAttention,
                         ::testing::Values("glm5-attn-tiny", "deepseek-v3-attn-tiny", "deepseek-v3-attn-tiny@64",
                                           "glm5-attn-tiny+fi", "deepseek-v3-attn-tiny@64+fi", "glm5-attn-tiny+auto", "glm5-attn-tiny+wg",
                                           "deepseek-v3-attn-tiny+wg", "glm5-attn-tiny+fp8", "deepseek-v3-attn-tiny+fp8",
                                           "deepseek-v3-attn-tiny@64+fi+fp8", "glm5-attn-tiny+auto+fp8",
                                           "glm5-attn-tiny+ws+fp8", "deepseek-v3-attn-tiny+ws+fp8"),
                         [](const auto& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (ch == '-' || ch == '@' || ch == '+') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace fp4moe
