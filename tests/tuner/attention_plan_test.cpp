// The attention plan (tuner/attention_plan.hpp) on made-up devices (what cudaGetDeviceProperties
// reports for an H100, an H200, a B200 and an RTX PRO 6000): the kernels it picks under every
// --attention-kernels value, that they are the GPU runner's choices as they stood before the plan
// moved to tuner/ (GpuRunner::Impl::choose_attention at 93b30e8, transcribed below as tables),
// that a flag value the device cannot run is refused in one line, and (CUDA build) that its
// dimension rules agree with the kernels' own can_implement functions. No GPU: nothing here
// launches a kernel. sm_100 / sm_120 choices: compiled, not run.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/attention/mla_decode_config.hpp"
#include "cuda/indexer/topk_smem.hpp"
#include "tuner/attention_plan.hpp"
#include "tuner/model_plan.hpp"
#include "tuner/moe_gemm_family.hpp"

#ifdef FP4MOE_HAVE_CUDA
#include "cuda/attention/kv_append.hpp"
#include "cuda/attention/mla.hpp"
#include "cuda/indexer/indexer.hpp"
#endif

using namespace fp4moe;
using namespace fp4moe::tuner;

namespace {

ArchInfo device(const std::string& part) {
  DeviceProps p;
  p.regs_per_sm = p.regs_per_block = 65536;
  p.max_threads_per_block = 1024;
  p.max_blocks_per_sm = 32;
  p.smem_reserved_per_block = 1024;
  p.name = part;
  if (part == "H100" || part == "H200") {
    p.cc = 90, p.smem_per_sm = 233472, p.sm_count = 132, p.max_threads_per_sm = 2048;
  } else if (part == "B200") {
    p.cc = 100, p.smem_per_sm = 233472, p.sm_count = 148, p.max_threads_per_sm = 2048;
  } else {  // RTX PRO 6000 (sm_120)
    p.cc = 120, p.smem_per_sm = 102400, p.sm_count = 188, p.max_threads_per_sm = 1536;
  }
  p.smem_per_block_optin = p.smem_per_sm - p.smem_reserved_per_block;
  return arch_of_device(p);
}

// GLM-5's attention (64 heads, latent 512 + rope 64, indexer 32 x 128, top-2048); `dense`
// dense-MLA layers then `dsa` DSA layers; indexer = false: DeepSeek-V3 (every layer dense).
AttentionDims glm5(int dense, int dsa, bool indexer = true) {
  AttentionDims d;
  d.heads = 64, d.kv_lora = 512, d.rope = 64;
  d.softmax_scale = 1.0 / 16.0;
  d.indexer = indexer;
  d.index_heads = 32, d.index_dim = 128, d.index_topk = 2048;
  for (int l = 0; l < dense; ++l) d.dsa_layer.push_back(false);
  for (int l = 0; l < dsa; ++l) d.dsa_layer.push_back(true);
  return d;
}

// The decisions as one comparable string.
std::string decisions(const AttentionPlan& p) {
  if (!p.error.empty()) return "refused";
  return std::string(p.mma_decode ? "mma" : "-") + (p.wgmma ? " wgmma" : "") + (p.wgmma_ws ? " ws" : "") + (p.flashinfer_decode ? " fi" : "") +
         " sparse" + std::to_string(p.mma_sparse_max_rows) + (p.flashinfer_prefill ? " fi-prefill" : "") +
         (p.fast_indexer ? " idx" : "") + (p.fast_index_key ? " key" : "") + (p.fast_latent ? " latent" : "") +
         " topk" + std::to_string(p.topk_one_cta_keys_many_rows) + "/" + std::to_string(p.topk_one_cta_max_rows);
}

struct Row {
  const char* part;
  AttentionKernels flag;
  bool fp8;
  const char* want;
};

}  // namespace

// The runner's choices before the move (choose_attention at 93b30e8), case by case, with GLM-5's
// dims over 1 dense-MLA + 2 DSA layers. Changed on purpose: a forced kernel the device cannot run
// (mma-decode / wgmma-decode / flashinfer-decode) was run on the own kernels for mma-decode and
// is now refused, like the other two.
TEST(AttentionPlan, ChoicesAreTheRunnersPerArchAndFlag) {
  using K = AttentionKernels;
  const std::vector<Row> rows = {
      {"H100", K::Auto, false, "mma fi sparse1 fi-prefill idx key latent topk32768/132"},
      {"H100", K::Auto, true, "mma sparse0 fi-prefill idx key latent topk32768/132"},  // FP8: kFp8DecodeOnMma
      {"H200", K::Auto, false, "mma fi sparse1 fi-prefill idx key latent topk32768/132"},
      {"H100", K::FlashInferDecode, false, "mma fi sparse0 fi-prefill idx key latent topk32768/132"},
      {"H100", K::FlashInferDecode, true, "mma fi sparse0 fi-prefill idx key latent topk32768/132"},
      {"H100", K::MmaDecode, false, "mma sparse0 fi-prefill idx key latent topk32768/132"},
      {"H100", K::WgmmaDecode, false, "mma wgmma sparse0 fi-prefill idx key latent topk32768/132"},
      {"H100", K::WgmmaDecode, true, "mma wgmma sparse0 fi-prefill idx key latent topk32768/132"},
      {"H100", K::WgmmaWsDecode, true, "mma ws sparse0 fi-prefill idx key latent topk32768/132"},
      {"H100", K::WgmmaWsDecode, false, "refused"},  // a BF16 cache: the ws variant is FP8-only
      {"H100", K::Own, false, "- sparse0 topk32768/132"},
      {"B200", K::Auto, false, "mma sparse0 idx key latent topk32768/148"},
      {"B200", K::Auto, true, "mma sparse0 idx key latent topk32768/148"},
      {"B200", K::MmaDecode, false, "mma sparse0 idx key latent topk32768/148"},
      {"B200", K::WgmmaDecode, false, "refused"},
      {"B200", K::WgmmaWsDecode, true, "refused"},
      {"B200", K::FlashInferDecode, false, "refused"},
      {"B200", K::Own, false, "- sparse0 topk32768/148"},
      {"RTX PRO 6000", K::Auto, false, "- sparse0 topk16384/188"},
      {"RTX PRO 6000", K::Auto, true, "- sparse0 topk16384/188"},
      {"RTX PRO 6000", K::MmaDecode, false, "refused"},
      {"RTX PRO 6000", K::WgmmaDecode, false, "refused"},
      {"RTX PRO 6000", K::WgmmaWsDecode, true, "refused"},
      {"RTX PRO 6000", K::FlashInferDecode, false, "refused"},
      {"RTX PRO 6000", K::Own, false, "- sparse0 topk16384/188"},
  };
  for (const Row& r : rows) {
    AttentionDims d = glm5(1, 2);
    d.kv_fp8 = r.fp8;
    const AttentionPlan p = plan_attention(device(r.part), true, d, r.flag);
    EXPECT_EQ(decisions(p), r.want) << r.part << " " << attention_kernels_name(r.flag) << (r.fp8 ? " fp8" : "") << ": "
                                    << p.error << p.line;
  }
}

TEST(AttentionPlan, OneTokenConstantsAndTopKSettingsComeFromThePlan) {
  const AttentionPlan p = plan_attention(device("H100"), true, glm5(0, 3), AttentionKernels::Auto);
  EXPECT_EQ(p.mma_sparse_max_rows, kMmaSparseMaxRows);
  EXPECT_EQ(p.topk_one_cta_min_rows, kTopKOneCtaMinRows);
  EXPECT_EQ(p.topk_sample_lines, kTopKSampleLines);
  // 32K-key rows on one CTA need (4096 + 64) * 4 + 32768 * 4 = 147,712 B: sm_90 / sm_100 yes, sm_120 (101,376) no.
  EXPECT_EQ(cuda::indexer::topk::select_smem_bytes(32768, 32768), 147712u);
  EXPECT_EQ(cuda::indexer::topk::max_one_cta_keys(232448), 32768);
  EXPECT_EQ(cuda::indexer::topk::max_one_cta_keys(101376), 16384);
  EXPECT_EQ(cuda::indexer::topk::max_one_cta_keys(147712), 32768);
  EXPECT_EQ(cuda::indexer::topk::max_one_cta_keys(147711), 16384);
}

TEST(AttentionPlan, DeepSeekV3WithoutIndexerGetsPrefillAndFusedLatentKeys) {
  const AttentionPlan p = plan_attention(device("H200"), true, glm5(4, 0, false), AttentionKernels::Auto);
  EXPECT_EQ(decisions(p), "mma fi sparse1 fi-prefill latent topk32768/132");
  EXPECT_NE(p.line.find("layers [0,1,2,3] (dense MLA)"), std::string::npos) << p.line;
  EXPECT_EQ(p.line.find("DSA"), std::string::npos) << p.line;
  EXPECT_EQ(p.line.find("indexer"), std::string::npos) << p.line;
}

TEST(AttentionPlan, HeadsDimsAndBuildDecideFlashInferAndTheFastPath) {
  // 128 heads: MlaDecodeMma (a multiple of 64) but not FlashInfer's decode or prefill (64 only).
  AttentionDims h128 = glm5(1, 1);
  h128.heads = 128;
  AttentionPlan p = plan_attention(device("H100"), true, h128, AttentionKernels::Auto);
  EXPECT_EQ(decisions(p), "mma sparse0 idx key latent topk32768/132");
  EXPECT_NE(p.line.find("enabled for 64 heads only"), std::string::npos) << p.line;
  p = plan_attention(device("H100"), true, h128, AttentionKernels::FlashInferDecode);
  EXPECT_EQ(p.error, "--attention-kernels flashinfer-decode: 128 heads (it takes 64)");
  // 32 heads: no fast path at all.
  AttentionDims h32 = glm5(1, 1);
  h32.heads = 32;
  p = plan_attention(device("H100"), true, h32, AttentionKernels::Auto);
  EXPECT_EQ(decisions(p), "- sparse0 topk32768/132");
  EXPECT_NE(p.line.find("32 heads unsupported"), std::string::npos) << p.line;
  // A binary without FlashInfer: MlaDecodeMma on sm_90, FlashInferDecode refused.
  p = plan_attention(device("H100"), false, glm5(1, 2), AttentionKernels::Auto);
  EXPECT_EQ(decisions(p), "mma sparse0 idx key latent topk32768/132");
  EXPECT_NE(p.line.find("built without FlashInfer"), std::string::npos) << p.line;
  p = plan_attention(device("H100"), false, glm5(1, 2), AttentionKernels::FlashInferDecode);
  EXPECT_NE(p.error.find("built without FlashInfer"), std::string::npos) << p.error;
  // Tiny dims (kv_lora 64): the own kernels under Auto; a forced kernel refused with the dims.
  AttentionDims tiny = glm5(1, 1);
  tiny.kv_lora = 64, tiny.rope = 16;
  p = plan_attention(device("H100"), true, tiny, AttentionKernels::Auto);
  EXPECT_EQ(decisions(p), "- sparse0 topk32768/132");
  EXPECT_NE(p.line.find("kv_lora_rank 64 / qk_rope_head_dim 16"), std::string::npos) << p.line;
  for (AttentionKernels k : {AttentionKernels::MmaDecode, AttentionKernels::WgmmaDecode,
                             AttentionKernels::FlashInferDecode}) {
    p = plan_attention(device("H100"), true, tiny, k);
    EXPECT_EQ(p.error, std::string("--attention-kernels ") + attention_kernels_name(k) +
                           ": kv_lora_rank 64 / qk_rope_head_dim 16 (the fast kernels take 512 / 64)");
  }
  // An indexer of other dims: MlaDecodeMma, the own scores and keys, so the latent keys unfused too.
  AttentionDims idx = glm5(0, 2);
  idx.index_heads = 16;
  p = plan_attention(device("B200"), true, idx, AttentionKernels::Auto);
  EXPECT_EQ(decisions(p), "mma sparse0 topk32768/148");
  EXPECT_NE(p.line.find("by the runner's RMSNorm, RoPE and append kernels"), std::string::npos) << p.line;
}

TEST(AttentionPlan, RefusalsAreOneLineNamingTheFlagAndTheReason) {
  const AttentionPlan wg = plan_attention(device("B200"), true, glm5(1, 2), AttentionKernels::WgmmaDecode);
  EXPECT_EQ(wg.error, "--attention-kernels wgmma-decode: MLA decode (wgmma): needs sm_90 (Hopper's wgmma)");
  const AttentionPlan mma = plan_attention(device("RTX PRO 6000"), true, glm5(1, 2), AttentionKernels::MmaDecode);
  EXPECT_EQ(mma.error, "--attention-kernels mma-decode: MLA decode (mma): needs " +
                           std::to_string(cuda::attention::decode::smem_bytes(false)) +
                           " B of shared memory per block, this GPU allows 101376 B");
  const AttentionPlan fi = plan_attention(device("B200"), true, glm5(1, 2), AttentionKernels::FlashInferDecode);
  EXPECT_EQ(fi.error, "--attention-kernels flashinfer-decode: MLA attention: the SM90 MLA kernel needs sm_90, this GPU "
                      "is sm_100");
  AttentionDims fp8 = glm5(1, 2);
  fp8.kv_fp8 = true;
  const AttentionPlan ws_bf16 = plan_attention(device("H100"), true, glm5(1, 2), AttentionKernels::WgmmaWsDecode);
  EXPECT_EQ(ws_bf16.error, "--attention-kernels wgmma-ws-decode: MLA decode (wgmma-ws): an FP8 E4M3 cache only (a BF16 "
                           "cache: the mma.sync / wgmma kernels)");
  const AttentionPlan ws_b200 = plan_attention(device("B200"), true, fp8, AttentionKernels::WgmmaWsDecode);
  EXPECT_EQ(ws_b200.error, "--attention-kernels wgmma-ws-decode: MLA decode (wgmma-ws): needs sm_90 (Hopper's wgmma)");
  const AttentionPlan ws = plan_attention(device("H100"), true, fp8, AttentionKernels::WgmmaWsDecode);
  EXPECT_NE(ws.line.find("MlaDecodeMma (warp-specialized wgmma"), std::string::npos) << ws.line;
  for (const AttentionPlan* p : {&wg, &mma, &fi, &ws_bf16, &ws_b200}) {
    EXPECT_EQ(p->error.find('\n'), std::string::npos);
    EXPECT_TRUE(p->line.empty());
  }
}

TEST(AttentionPlan, StartUpLineAndReasonsSayWhatRunsWhere) {
  const AttentionPlan p = plan_attention(device("H100"), true, glm5(1, 2), AttentionKernels::Auto);
  EXPECT_EQ(p.line.find('\n'), std::string::npos);
  EXPECT_EQ(p.line.rfind("attention: ", 0), 0u) << p.line;
  for (const char* s : {"latent keys by cuda/attention's fused RMSNorm + RoPE + cache write", "layers [0] (dense MLA)",
                        "MlaSm90::run_device", "MlaSm90, causal", "layers [1,2] (DSA top-2048)",
                        "one-token steps: MlaDecodeMma", "indexer keys by cuda/indexer's fused LayerNorm",
                        "scores on cuda/indexer's mma kernel", "rows of <= 32768 keys on one CTA at 64-132 rows"})
    EXPECT_NE(p.line.find(s), std::string::npos) << s << " not in " << p.line;
  ASSERT_GE(p.choices.size(), 6u);
  for (const AttentionChoice& c : p.choices) {
    EXPECT_FALSE(c.part.empty());
    EXPECT_FALSE(c.kernel.empty()) << c.part;
    EXPECT_FALSE(c.why.empty()) << c.part;
  }
  // The own kernels everywhere: one clause with the reason.
  const AttentionPlan own = plan_attention(device("RTX PRO 6000"), true, glm5(1, 2), AttentionKernels::Auto);
  EXPECT_EQ(own.line.rfind("attention: every layer on the runner's own kernels", 0), 0u) << own.line;
  EXPECT_NE(own.line.find("shared memory per block"), std::string::npos) << own.line;
  for (const AttentionChoice& c : own.choices) EXPECT_FALSE(c.why.empty()) << c.part;
}

TEST(AttentionPlan, FlagNamesRoundTripAndOthersAreRefused) {
  for (AttentionKernels k : {AttentionKernels::Auto, AttentionKernels::Own, AttentionKernels::FlashInferDecode,
                             AttentionKernels::MmaDecode, AttentionKernels::WgmmaDecode, AttentionKernels::WgmmaWsDecode})
    EXPECT_EQ(parse_attention_kernels(attention_kernels_name(k)), k);
  EXPECT_THROW(parse_attention_kernels("wgmma"), Error);
  EXPECT_THROW(parse_attention_kernels(""), Error);
}

// `tune --dry-run`'s whole-model plan lists the runner's attention choices (Auto) for the arch.
TEST(AttentionPlan, TheDryRunModelPlanShowsTheRunnersChoices) {
  auto runner_decode = [](const char* arch) {
    const ModelPlan plan = plan_model(arch_by_name(arch), glm5_config(), {1}, true);
    for (const ModelPlanEntry& e : plan.entries)
      if (e.part == "GPU runner: MLA decode steps and DSA top-k rows") return e;
    ADD_FAILURE() << arch << ": no runner attention entry";
    return ModelPlanEntry{};
  };
  EXPECT_EQ(runner_decode("sm_90").kernel, flashinfer_mla_built() ? "FlashInfer MlaSm90 (device-built schedule)"
                                                                  : "MlaDecodeMma (mma.sync)");
  EXPECT_EQ(runner_decode("sm_100").kernel, "MlaDecodeMma (mma.sync)");
  const ModelPlanEntry sm120 = runner_decode("sm_120");
  EXPECT_EQ(sm120.kernel, "the runner's own kernels");
  EXPECT_NE(sm120.why.find("shared memory per block"), std::string::npos) << sm120.why;
}

#ifdef FP4MOE_HAVE_CUDA
// The plan's dimension rules are the kernels': cuda/'s can_implement functions (host code, no
// device needed) give the same verdict over a grid of dims.
TEST(AttentionPlan, DimensionRulesAgreeWithTheKernelsCanImplement) {
  namespace at = cuda::attention;
  namespace ix = cuda::indexer;
  for (int64_t heads : {16, 32, 64, 96, 128, 256})
    for (int64_t ih : {16, 32, 64})
      for (int64_t idim : {64, 128})
        for (int64_t rope : {0, 6, 16, 64, 130})
          for (int64_t lora : {256, 512})
            for (bool il : {true, false}) {
              AttentionDims d = glm5(1, 1);
              d.heads = heads, d.index_heads = ih, d.index_dim = idim, d.rope = rope, d.kv_lora = lora;
              d.index_rope_interleaved = il;
              const AttentionPlan p = plan_attention(device("H100"), flashinfer_mla_built(), d, AttentionKernels::Auto);
              at::MlaDesc desc;
              desc.num_heads = int(heads);
              desc.sm_scale = float(d.softmax_scale);
              const bool fast = lora == 512 && rope == 64 && heads % 64 == 0;
              ASSERT_EQ(p.mma_decode, fast) << heads << " " << lora << " " << rope;
              if (!fast) continue;
              EXPECT_EQ(p.flashinfer_decode, at::mla_can_implement(desc, 90).empty() && heads == 64) << heads;
              EXPECT_EQ(p.fast_indexer, ix::indexer_can_implement(ih, idim).empty()) << ih << " x " << idim;
              EXPECT_EQ(p.fast_index_key,
                        p.fast_indexer && ix::index_key_prep_can_implement(idim, int(rope), il).empty());
              EXPECT_EQ(p.fast_latent, at::kv_latent_prep_can_implement(lora, rope).empty() && p.fast_index_key);
            }
}
#endif
