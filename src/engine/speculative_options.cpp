#include "engine/speculative_options.hpp"

#include "core/error.hpp"

namespace fp4moe::engine {

const char* const kSpeculativeAlgorithmHelp =
    "NEXTN (EAGLE: the same): speculative decoding with the checkpoint's MTP layer as the draft (cpu and cuda "
    "backends; a checkpoint without one is refused). Greedy output is unchanged token for token (on cuda: where the "
    "BF16 logits' top-2 margin allows); sampled output keeps the target's distribution (rejection sampling). A decode "
    "round is ONE draft/verify round: --num-continuous-decode-steps must be 1 with it. An MTP layer whose routed experts "
    "the checkpoint keeps in BF16 (NVIDIA's NVFP4 checkpoints) has them quantized to NVFP4 at load for the drafts "
    "(--speculative-draft-model-quantization)";
const char* const kSpeculativeNumStepsHelp = "MTP draft steps per draft/verify round, 1..16 (default 3)";
const char* const kSpeculativeEagleTopkHelp = "draft branches per step: 1 only (a chain; draft trees are not offered)";
const char* const kSpeculativeNumDraftTokensHelp =
    "tokens one verify step checks per request: --speculative-num-steps + 1 only (the default)";

const char* const kSpeculativeDraftModelQuantizationHelp =
    "the MTP layer's routed experts where the checkpoint keeps them in BF16 (NVIDIA's NVFP4 checkpoints): nvfp4 (the "
    "default) quantizes them to NVFP4 at load (16-element blocks, E4M3 block scales, one FP32 global per expert) so "
    "that drafts take the FP4 grouped GEMM; unquant keeps BF16 (on cuda a dense-over-all-experts fallback, refused "
    "where its scratch does not fit the step). Drafts only: the output is the target's either way (acceptance may "
    "differ). Experts stored in FP4 are used as stored";

const char* const kSpeculativeDisableByBatchSizeHelp =
    "N >= 1: a decode round whose running batch holds more than N requests runs one plain decode step (one token per "
    "request) instead of a draft/verify round; rounds of N or fewer requests speculate again (default: speculate at "
    "every batch size). At large batches a plain step already uses the GPU well and a round costs several of them. "
    "Output is unchanged (greedy: token for token). The pairs plain steps complete wait for the MTP layer and run "
    "together before the next draft/verify round (or as their request leaves), so its KV and the next round's first "
    "draft stay exact. Needs --speculative-algorithm";

int32_t speculative_steps(const SpeculativeFlags& f, const std::string& backend, int32_t continuous_decode_steps) {
  if (f.algorithm.empty()) {
    FP4MOE_CHECK(!f.num_steps && !f.eagle_topk && !f.num_draft_tokens,
                 "--speculative-num-steps / --speculative-eagle-topk / --speculative-num-draft-tokens need "
                 "--speculative-algorithm NEXTN");
    return 0;
  }
  FP4MOE_CHECK(f.algorithm == "NEXTN" || f.algorithm == "EAGLE",
               "--speculative-algorithm {}: only NEXTN (or its alias EAGLE: the model's own MTP layer) is offered",
               f.algorithm);
  const int32_t n = f.num_steps.value_or(3);
  FP4MOE_CHECK(n >= 1 && n <= 16, "--speculative-num-steps {} must be in [1, 16]", n);
  FP4MOE_CHECK(f.eagle_topk.value_or(1) == 1,
               "--speculative-eagle-topk {}: only 1 (chain drafts) is offered; draft trees are not", *f.eagle_topk);
  FP4MOE_CHECK(f.num_draft_tokens.value_or(n + 1) == n + 1,
               "--speculative-num-draft-tokens {} must be --speculative-num-steps + 1 = {} with a chain draft",
               *f.num_draft_tokens, n + 1);
  FP4MOE_CHECK(backend == "cpu" || backend == "cuda",
               "--speculative-algorithm: the {} backend does not run the MTP draft (--backend cpu and cuda do)", backend);
  FP4MOE_CHECK(continuous_decode_steps == 1,
               "--speculative-algorithm with --num-continuous-decode-steps {}: a decode round is one draft/verify round "
               "(up to N + 1 tokens per request); set --num-continuous-decode-steps 1",
               continuous_decode_steps);
  return n;
}

bool quantize_draft_experts(const SpeculativeFlags& f, bool speculating) {
  if (!f.draft_model_quantization) return true;
  const std::string& q = *f.draft_model_quantization;
  FP4MOE_CHECK(q == "nvfp4" || q == "unquant",
               "--speculative-draft-model-quantization {}: nvfp4 (quantize the MTP layer's BF16 routed experts at load) "
               "or unquant (keep them BF16)",
               q);
  FP4MOE_CHECK(speculating, "--speculative-draft-model-quantization needs --speculative-algorithm NEXTN (the draft's experts)");
  return q == "nvfp4";
}

int32_t speculative_disable_by_batch_size(const SpeculativeFlags& f, bool speculating) {
  if (!f.disable_by_batch_size) return 0;
  const int32_t n = *f.disable_by_batch_size;
  FP4MOE_CHECK(speculating, "--speculative-disable-by-batch-size needs --speculative-algorithm NEXTN (it turns "
               "speculation off for large batches)");
  FP4MOE_CHECK(n >= 1, "--speculative-disable-by-batch-size {} must be at least 1 (batches of more than N requests "
               "decode without speculation)", n);
  return n;
}

}  // namespace fp4moe::engine
