// The attention plan (attention_plan.hpp). The shared-memory rules are the kernels' own
// (cuda/attention/mla_decode_config.hpp, cuda/indexer/topk_smem.hpp: plain C++); the dimension
// rules mirror the kernels' can_implement functions (tests/tuner/attention_plan_test.cpp checks
// them against each other in a CUDA build).
#include "tuner/attention_plan.hpp"

#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/attention/mla_decode_config.hpp"
#include "cuda/indexer/topk_smem.hpp"

namespace fp4moe::tuner {
namespace {

namespace at = cuda::attention;

bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// FlashInfer's SM90 MLA (cuda/attention/mla.cpp: mla_can_implement).
std::string flashinfer_why(const AttentionDims& d, int cc, bool built) {
  if (!power_of_two(d.heads) || d.heads > 128)
    return fmt::format("MLA attention: {} heads unsupported (the SM90 MLA kernel needs a power of two <= 128)",
                       d.heads);
  if (!(d.softmax_scale > 0)) return fmt::format("MLA attention: sm_scale {} must be positive", d.softmax_scale);
  if (!built) return "MLA attention: built without FlashInfer (configure with its headers, see setup.sh)";
  if (cc != 90) return fmt::format("MLA attention: the SM90 MLA kernel needs sm_90, this GPU is sm_{}", cc);
  return "";
}

// cuda/indexer's mma scores (indexer_can_implement).
std::string indexer_why(const AttentionDims& d) {
  if (d.index_heads != at::kIndexHeads || d.index_dim != at::kIndexDim)
    return fmt::format("indexer: {} heads x {} unsupported (the GPU indexer is built for {} heads x {})", d.index_heads,
                       d.index_dim, at::kIndexHeads, at::kIndexDim);
  return "";
}

// cuda/indexer's fused key LayerNorm + RoPE + cache write (index_key_prep_can_implement; the
// index key's RoPE covers the head's qk_rope_head_dim dims; 4 per lane of a warp over 128).
std::string index_key_why(const AttentionDims& d) {
  if (d.index_dim != at::kIndexDim) return fmt::format("index key prep: {} dims (the fused kernel takes 128)", d.index_dim);
  if (d.rope < 0 || d.rope > at::kIndexDim || d.rope % 2 != 0)
    return fmt::format("index key prep: rope_dim {} (even, <= 128)", d.rope);
  if (!d.index_rope_interleaved && d.rope % 8 != 0)
    return fmt::format("index key prep: halves RoPE over {} dims (a multiple of 8)", d.rope);
  return "";
}

// cuda/attention's fused latent RMSNorm + RoPE + cache write (kv_latent_prep_can_implement).
std::string latent_why(const AttentionDims& d) {
  if (d.kv_lora != at::kCkvDim || d.rope != at::kKpeDim)
    return fmt::format("latent prep: latent {} + rope {} (the fused kernel takes {} + {})", d.kv_lora, d.rope,
                       at::kCkvDim, at::kKpeDim);
  return "";
}

AttentionPlan refused(std::string error) {
  AttentionPlan p;
  p.error = std::move(error);
  return p;
}

std::string layer_list(const std::vector<bool>& dsa, bool want) {
  std::string s;
  for (size_t l = 0; l < dsa.size(); ++l) {
    if (dsa[l] != want) continue;
    if (!s.empty()) s += ',';
    s += std::to_string(l);
  }
  return s;
}

// The start-up line from the plan's decisions.
std::string plan_line(const AttentionPlan& p, const AttentionDims& d) {
  const std::string own = "the runner's own kernels (one CTA per token x head, FP32)";
  if (!p.mma_decode) return fmt::format("attention: every layer on {}: {}", own, p.decode_why);
  const std::string fast =
      p.flashinfer_decode ? "FlashInfer's SM90 MLA over a device-built schedule (MlaSm90::run_device, graph-capturable)"
      : p.wgmma_ws        ? "cuda/attention MlaDecodeMma (warp-specialized wgmma, device-built split schedule, graph-capturable)"
      : p.wgmma           ? "cuda/attention MlaDecodeMma (wgmma, device-built split schedule, graph-capturable)"
                          : "cuda/attention MlaDecodeMma (mma.sync, device-built split schedule, graph-capturable)";
  std::string line = fmt::format("attention: latent keys {};", p.fast_latent
                                                                  ? "by cuda/attention's fused RMSNorm + RoPE + cache write"
                                                                  : "by the runner's RMSNorm, RoPE and append kernels");
  const std::string dense = layer_list(d.dsa_layer, false), dsa = layer_list(d.dsa_layer, true);
  if (!dense.empty())
    line += fmt::format(
        " layers [{}] (dense MLA): decode steps on {}, prefill / mixed steps on {};", dense, fast,
        p.flashinfer_prefill ? "FlashInfer's SM90 MLA (MlaSm90, causal, planned per eager step; else " + own + ")"
                             : own + " (" + p.prefill_why + ")");
  if (!dsa.empty())
    line += fmt::format(" layers [{}] (DSA top-{}): every token's top-k rows on {}{};", dsa, d.index_topk, fast,
                        p.mma_sparse_max_rows > 0 ? " (one-token steps: MlaDecodeMma, mma.sync)" : "");
  if (d.indexer)
    line += fmt::format(" indexer keys {}, scores on {}, top-k on cuda/indexer's radix top-k (rows of <= {} keys on one "
                        "CTA at {}-{} rows, a {}-line threshold sample above)",
                        p.fast_index_key ? "by cuda/indexer's fused LayerNorm + RoPE + cache write"
                                         : "by the runner's LayerNorm, RoPE and append kernels",
                        p.fast_indexer ? "cuda/indexer's mma kernel" : "the runner's own kernel",
                        p.topk_one_cta_keys_many_rows, p.topk_one_cta_min_rows, p.topk_one_cta_max_rows,
                        p.topk_sample_lines);
  if (line.back() == ';') line.pop_back();
  return line;
}

}  // namespace

AttentionKernels parse_attention_kernels(const std::string& name) {
  for (AttentionKernels k : {AttentionKernels::Auto, AttentionKernels::Own, AttentionKernels::FlashInferDecode,
                             AttentionKernels::MmaDecode, AttentionKernels::WgmmaDecode, AttentionKernels::WgmmaWsDecode})
    if (name == attention_kernels_name(k)) return k;
  FP4MOE_FAIL(
      "--attention-kernels must be auto, own, flashinfer-decode, mma-decode, wgmma-decode or wgmma-ws-decode (got '{}')",
      name);
}

const char* attention_kernels_name(AttentionKernels k) {
  switch (k) {
    case AttentionKernels::Auto: return "auto";
    case AttentionKernels::Own: return "own";
    case AttentionKernels::FlashInferDecode: return "flashinfer-decode";
    case AttentionKernels::MmaDecode: return "mma-decode";
    case AttentionKernels::WgmmaDecode: return "wgmma-decode";
    case AttentionKernels::WgmmaWsDecode: return "wgmma-ws-decode";
  }
  return "?";
}

bool flashinfer_mla_built() {
#if defined(FP4MOE_HAVE_FLASHINFER)
  return true;
#else
  return false;
#endif
}

AttentionPlan plan_attention(const ArchInfo& a, bool flashinfer_built, const AttentionDims& d, AttentionKernels k) {
  AttentionPlan p;
  const bool wgmma = k == AttentionKernels::WgmmaDecode, wgmma_ws = k == AttentionKernels::WgmmaWsDecode;
  bool dense_layer = false;
  for (bool dsa : d.dsa_layer) dense_layer |= !dsa;
  bool fp8_on_mma = false;  // Auto, FlashInfer's decode could run, but the cache is FP8
  if (k == AttentionKernels::Own) {
    p.decode_why = "attention kernels forced to own (--attention-kernels own)";
  } else {
    if (d.kv_lora != at::kCkvDim || d.rope != at::kKpeDim)
      p.decode_why = fmt::format("kv_lora_rank {} / qk_rope_head_dim {} (the fast kernels take {} / {})", d.kv_lora,
                                 d.rope, at::kCkvDim, at::kKpeDim);
    else
      p.decode_why = at::decode::can_implement(int(d.heads), d.kv_fp8, float(d.softmax_scale), a.smem_per_block_optin,
                                               a.cc, wgmma, wgmma_ws);
    // A kernel the flag forces must run: refused in one line, never the own kernels instead.
    if (k != AttentionKernels::Auto && !p.decode_why.empty())
      return refused(fmt::format("--attention-kernels {}: {}", attention_kernels_name(k), p.decode_why));
    p.mma_decode = p.decode_why.empty();
  }
  if (p.mma_decode) {
    p.wgmma = wgmma;
    p.wgmma_ws = wgmma_ws;
    // FlashInfer's kernel for decode and top-k rows where it runs (Auto: measured 1.1-1.2x the
    // serve sweep's output tok/s of MlaDecodeMma at caps 256-2048, bench/RESULTS.md); forced by
    // FlashInferDecode (refused where it cannot run), never under MmaDecode / WgmmaDecode.
    const std::string fi_why = flashinfer_why(d, a.cc, flashinfer_built);
    const std::string fi64_why = fi_why.empty() && d.heads != 64 ? fmt::format("{} heads (it takes 64)", d.heads) : fi_why;
    if (k == AttentionKernels::FlashInferDecode && !fi64_why.empty())
      return refused("--attention-kernels flashinfer-decode: " + fi64_why);
    // Auto over an FP8 cache keeps every decode and top-k row on MlaDecodeMma: FlashInfer dequantizes
    // each E4M3 tile in BF16 and takes 1.3-1.4x its time there (kFp8DecodeOnMma).
    fp8_on_mma = fi64_why.empty() && k == AttentionKernels::Auto && d.kv_fp8 && kFp8DecodeOnMma;
    if (fi64_why.empty() && ((k == AttentionKernels::Auto && !fp8_on_mma) || k == AttentionKernels::FlashInferDecode)) {
      p.flashinfer_decode = true;
      if (k == AttentionKernels::Auto) p.mma_sparse_max_rows = kMmaSparseMaxRows;
    }
    // 64 heads only: the head count cuda/attention's GPU tests run MlaSm90 with (128 would be
    // FlashInfer's other tile packing, not yet run here).
    p.prefill_why = !fi_why.empty() || d.heads == 64
                        ? fi_why
                        : fmt::format("MlaSm90 prefill is enabled for 64 heads only (verified); {} here", d.heads);
    p.flashinfer_prefill = dense_layer && p.prefill_why.empty();
  }
  p.fast_indexer = p.mma_decode && d.indexer && indexer_why(d).empty();
  p.fast_index_key = p.fast_indexer && index_key_why(d).empty();
  p.fast_latent = p.mma_decode && latent_why(d).empty() && (!d.indexer || p.fast_index_key);
  p.topk_one_cta_keys_many_rows = cuda::indexer::topk::max_one_cta_keys(a.smem_per_block_optin);
  p.topk_one_cta_max_rows = a.sm_count;

  // The reasons, one per decision.
  const std::string mma = p.wgmma_ws ? "MlaDecodeMma (warp-specialized wgmma)"
                          : p.wgmma  ? "MlaDecodeMma (wgmma)"
                                     : "MlaDecodeMma (mma.sync)";
  const std::string own = "the runner's own kernels";
  const std::string decode_kernel = p.flashinfer_decode ? "FlashInfer MlaSm90 (device-built schedule)"
                                    : p.mma_decode       ? mma
                                                         : own;
  std::string decode_reason;
  if (fp8_on_mma)
    decode_reason = "an FP8 E4M3 cache: 0.71-0.79x FlashInfer's FP8 decode time at B >= 16 (it dequantizes each tile in BF16)";
  else if (p.flashinfer_decode)
    decode_reason = k == AttentionKernels::FlashInferDecode
                        ? "--attention-kernels flashinfer-decode"
                        : "sm_90, 64 heads: 1.1-1.2x the serve sweep's output tok/s of MlaDecodeMma at caps 256-2048";
  else if (p.mma_decode)
    decode_reason = k == AttentionKernels::MmaDecode || wgmma || wgmma_ws
                        ? fmt::format("--attention-kernels {}", attention_kernels_name(k))
                        : "FlashInfer's SM90 MLA cannot run here; MlaDecodeMma fits";
  else
    decode_reason = p.decode_why;
  p.choices.push_back({"MLA decode steps and DSA top-k rows", decode_kernel, decode_reason});
  if (p.mma_sparse_max_rows > 0)
    p.choices.push_back({fmt::format("DSA rows of steps of <= {} token(s)", p.mma_sparse_max_rows), mma,
                         "0.85-0.86x FlashInfer's device-scheduled time at 1 row (1.00x at 2, 1.12-1.28x at 4-16)"});
  if (dense_layer)
    p.choices.push_back({"dense-MLA prefill / mixed steps", p.flashinfer_prefill ? "FlashInfer MlaSm90 (causal)" : own,
                         p.flashinfer_prefill ? "sm_90, 64 heads, FlashInfer built"
                         : !p.mma_decode      ? "no fast decode path"
                                              : p.prefill_why});
  p.choices.push_back({"latent keys (RMSNorm + RoPE + cache write)",
                       p.fast_latent ? "cuda/attention kv_latent_prep (one launch)" : own,
                       p.fast_latent               ? "512 + 64 latent and every key of the layer fused"
                       : !p.mma_decode             ? "no fast decode path"
                       : !latent_why(d).empty()    ? latent_why(d)
                                                   : "the index keys are not fused (see below)"});
  if (d.indexer) {
    p.choices.push_back({"indexer scores", p.fast_indexer ? "cuda/indexer indexer_score_mma" : own,
                         p.fast_indexer ? "32 heads x 128" : !p.mma_decode ? "no fast decode path" : indexer_why(d)});
    p.choices.push_back({"index keys (LayerNorm + RoPE + cache write)",
                         p.fast_index_key ? "cuda/indexer index_key_prep (one launch)" : own,
                         p.fast_index_key ? "128 dims" : !p.fast_indexer ? "the scores are not on cuda/indexer"
                                                                         : index_key_why(d)});
    p.choices.push_back(
        {"indexer top-k", "cuda/indexer radix top-k",
         fmt::format("rows of <= {} keys on one CTA from {} rows up to one per SM ({}): {} B of shared memory per block "
                     "here; longer rows' threshold from a {}-line sample",
                     p.topk_one_cta_keys_many_rows, p.topk_one_cta_min_rows,
                     a.sm_count > 0 ? std::to_string(a.sm_count) : std::string("the SM count"),
                     with_commas(a.smem_per_block_optin), p.topk_sample_lines)});
  }
  p.line = plan_line(p, d);
  return p;
}

}  // namespace fp4moe::tuner
