// The attention plan: which kernels run the GPU runner's MLA attention, the DSA indexer and its
// top-k, chosen at start-up from the device's properties, the model's dimensions and the
// --attention-kernels flag alone (no measurement, no GPU needed: the unit tests judge made-up
// sm_90 / sm_100 / sm_120 devices). Each choice carries its reason; format_attention_plan is the
// runner's start-up line. The MoE GEMM's plan is model_plan.hpp / plan_cache.hpp beside it.
// sm_100 / sm_120 choices: compiled, not run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tuner/arch.hpp"

namespace fp4moe::tuner {

// --attention-kernels (serve, bench step):
//   Auto: on sm_90 with 64 heads, FlashInfer's SM90 MLA kernel over a schedule built on the
//         device (MlaSm90::run_device, graph-capturable) for decode steps and DSA top-k rows
//         (one-token steps' DSA rows: MlaDecodeMma); elsewhere cuda/attention's MlaDecodeMma
//         (mma.sync, its own device-built split schedule) where the dims allow (kv_lora_rank
//         512, qk_rope 64, heads a multiple of 64, sm_89+ with ~199 KB of shared memory per
//         block); with cuda/indexer's mma scores (32 index heads x 128) and, on sm_90,
//         FlashInfer's MlaSm90 for dense-attention layers' eager prefill / mixed steps; the
//         runner's own any-dims kernels elsewhere;
//   FlashInferDecode: as Auto, refused where FlashInfer's decode cannot run;
//   MmaDecode: as Auto, but decode steps and top-k rows always on MlaDecodeMma;
//   WgmmaDecode: as MmaDecode, with MlaDecodeMma's wgmma variant (sm_90; refused elsewhere);
//   WgmmaWsDecode: as MmaDecode, with MlaDecodeMma's warp-specialized wgmma variant (sm_90 and
//         an FP8 E4M3 cache; refused elsewhere). Not the default: not yet measured;
//   Own: the runner's own kernels everywhere (tests compare them with the others).
enum class AttentionKernels : int { Auto, Own, FlashInferDecode, MmaDecode, WgmmaDecode, WgmmaWsDecode };

// "auto" | "own" | "flashinfer-decode" | "mma-decode" | "wgmma-decode" | "wgmma-ws-decode"; an Error (one
// line) otherwise.
AttentionKernels parse_attention_kernels(const std::string& name);
const char* attention_kernels_name(AttentionKernels k);

// Steps of at most this many tokens send their DSA rows to MlaDecodeMma even where FlashInfer's
// decode serves the rest (Auto; bench attention's sparse-mla rows, H100: MlaDecodeMma takes
// 0.85-0.86x FlashInfer's device-scheduled time at 1 row, 1.00x at 2, 1.12-1.28x at 4-16).
inline constexpr int kMmaSparseMaxRows = 1;
// Auto over an FP8 E4M3 cache: every decode and DSA top-k row on MlaDecodeMma, none on FlashInfer's
// SM90 MLA (bench attention, H100: MlaDecodeMma takes 0.71-0.79x FlashInfer's FP8 decode time at
// B 16-256, ctx 8K-32K; FlashInfer dequantizes each E4M3 tile to BF16 in the loop).
inline constexpr bool kFp8DecodeOnMma = true;
// cuda/indexer's top-k settings, from bench attention's top-k rows (H100; bench/RESULTS.md):
// - from kTopKOneCtaMinRows rows up to one row per SM, rows of 16K-32K keys on one CTA (one
//   145 KB block per SM): 0.78-0.82x the sampled path's time at 64 and 128 rows of 32K;
//   0.94-0.99x at 1-16 rows (the sample is faster there) and 1.04x at 256 rows (two waves);
// - longer rows' threshold from a kTopKSampleLines-line sample: 0.89-0.95x the 256-line
//   default's time at 32K (1-256 rows), 0.95-1.04x at 128K (about even).
// The same selection either way.
inline constexpr int kTopKOneCtaMinRows = 64;
inline constexpr int kTopKSampleLines = 128;

// What the plan needs of the model (model::MlaModelConfig's fields, per runner layer).
struct AttentionDims {
  int64_t heads = 0, kv_lora = 0, rope = 0;
  double softmax_scale = 0.0;
  bool kv_fp8 = false;  // an FP8 E4M3 cache (else BF16)
  bool indexer = false;  // the model has a DSA indexer
  int64_t index_heads = 0, index_dim = 0, index_topk = 0;
  bool index_rope_interleaved = true;
  // Per runner layer: true for a DSA layer (its own indexer, or "shared": the previous layer's
  // top-k), false for a dense-MLA layer.
  std::vector<bool> dsa_layer;
};

// One decision and its reason, for tests and `tune --dry-run`.
struct AttentionChoice {
  std::string part;    // "MLA decode", "DSA top-k rows", ...
  std::string kernel;  // what runs it
  std::string why;     // the rule or the measurement behind it
};

struct AttentionPlan {
  std::string error;  // a refused --attention-kernels value (one line); nothing else is set then

  bool mma_decode = false;         // MlaDecodeMma is built (decode / DSA rows where FlashInfer does not take them)
  bool wgmma = false;              // ... as its wgmma variant
  bool wgmma_ws = false;           // ... as its warp-specialized wgmma variant (FP8 cache)
  bool flashinfer_decode = false;  // FlashInfer's MlaSm90 over a device-built schedule: decode and DSA rows
  int mma_sparse_max_rows = 0;     // steps of <= this many tokens: DSA rows on MlaDecodeMma (0: none)
  bool flashinfer_prefill = false;  // MlaSm90 for dense-MLA layers' eager prefill / mixed steps
  bool fast_indexer = false;       // cuda/indexer's mma scores
  bool fast_index_key = false;     // cuda/indexer's fused key LayerNorm + RoPE + cache write
  bool fast_latent = false;        // cuda/attention's fused latent RMSNorm + RoPE + cache write
  int topk_one_cta_keys_many_rows = 0;  // rows up to this many keys on one CTA, between the next two
  int topk_one_cta_min_rows = kTopKOneCtaMinRows;
  int topk_one_cta_max_rows = 0;  // the SM count
  int topk_sample_lines = kTopKSampleLines;

  std::string decode_why;   // why not the fast decode kernels (empty: they run)
  std::string prefill_why;  // why not MlaSm90 prefill (where there are dense layers)
  std::vector<AttentionChoice> choices;
  std::string line;  // the runner's start-up line ("attention: ...")
};

// The plan for `dims` on a device of `arch` (cc, smem_per_block_optin, sm_count) in a binary
// with (flashinfer_built) or without FlashInfer's SM90 MLA, under `kernels`. Pure: the same
// inputs give the same plan on any machine.
AttentionPlan plan_attention(const ArchInfo& arch, bool flashinfer_built, const AttentionDims& dims,
                             AttentionKernels kernels);

// True when this binary has FlashInfer's SM90 MLA (built with its headers and CUDA).
bool flashinfer_mla_built();

}  // namespace fp4moe::tuner
