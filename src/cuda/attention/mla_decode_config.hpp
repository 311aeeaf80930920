// Internal to cuda/attention, plain C++ (no CUDA headers): the MLA decode kernels' tile
// configuration and shared-memory carve-up (mla_decode_mma.cuh lays its shared memory out by
// these), and the rule of where they run. mla_decode_params.hpp (the launches) and the tuner's
// attention plan (tuner/attention_plan.cpp, which judges an arch without a GPU) both read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fp4moe::cuda::attention::decode {

constexpr int kThreads = 256;
constexpr int kWarps = 8;
constexpr int kHeadsPerCta = 64;
constexpr int kCkv = 512, kKpe = 64, kQk = kCkv + kKpe;
constexpr int kStages = 3;

template <bool kFp8>
struct Cfg {
  static constexpr int kTk = kFp8 ? 64 : 32;                 // keys per tile
  static constexpr int kElem = kFp8 ? 1 : 2;                 // bytes per cached element
  static constexpr int kRowBytes = kQk * kElem;              // one key: [latent 512 | rope 64]
  static constexpr int kKvPitch = kRowBytes + 16;            // conflict-free ldmatrix rows
  static constexpr int kQPitch = kQk * 2 + (kFp8 ? 32 : 16);  // 16-bit Q rows (FP8: 8 B loads)
  static constexpr int kChunks = kRowBytes / 16;             // 16 B copies per key
  static constexpr int kLatentChunks = kCkv * kElem / 16;    // of which from the latent pool
  static constexpr int kNT = kTk / 8;                        // n8 tiles of S per warp
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQPitch;
  static constexpr size_t kStageBytes = size_t(kTk) * kKvPitch;
  static constexpr size_t kXchgBytes = size_t(kWarps) * kNT * 32 * 4 * sizeof(float);
  static constexpr size_t kSlotBytes = size_t(kStages) * kTk * sizeof(int64_t);  // the tiles' cache slots
  static constexpr size_t kConvBytes = 0;  // (the wgmma variant with an FP8 cache: its FP16 tiles)
  static constexpr size_t kSmemBytes = kQBytes + kStages * kStageBytes + kXchgBytes + 16 + kSlotBytes;
  static_assert((kKvPitch / 4) % 8 == 4, "KV rows must shift banks by 4 words (mod 32)");
  static_assert(kSmemBytes <= 227 * 1024, "");
};

// The wgmma variant (BF16 cache, sm_90a): Q and each KV tile stored as 8 x 8 core matrices of
// 128 contiguous bytes (no padding), [row / 8][dim / 8][row % 8][dim % 8]: the no-swizzle
// canonical layout (cuda/common/wgmma_prims.cuh) of Q and K as K-major operands and of V (the
// latent dims of the same tile) as an MN-major one.
struct CfgWg : Cfg<false> {
  static constexpr int kDimGroups = kQk / 8;                           // 72 core matrices per 8 rows
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQk * 2;    // 73,728
  static constexpr size_t kStageBytes = size_t(kTk) * kRowBytes;        // 36,864
  static constexpr size_t kSmemBytes = kQBytes + kStages * kStageBytes + kXchgBytes + 16 + kSlotBytes;
  static_assert(kSmemBytes <= 227 * 1024, "");
};

// The wgmma variant with an FP8 cache: tiles of 32 keys whose codes land as plain 576-byte rows,
// each thread converting the chunks it copied to FP16 (exact: E4M3 is a subset of FP16) into one
// of two core-matrix tiles (CfgWg's layout), which wgmma reads with the FP16 Q; P is FP16.
struct CfgWgFp8 : Cfg<true> {
  static constexpr int kTk = 32;
  static constexpr int kNT = kTk / 8;
  static constexpr int kDimGroups = kQk / 8;
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQk * 2;    // 73,728 (FP16)
  static constexpr size_t kStageBytes = size_t(kTk) * kRowBytes;        // 18,432 (codes)
  static constexpr size_t kConvBytes = size_t(kTk) * kQk * 2;           // 36,864 (one FP16 tile)
  static constexpr size_t kXchgBytes = size_t(kWarps) * kNT * 32 * 4 * sizeof(float);
  static constexpr size_t kSlotBytes = size_t(kStages) * kTk * sizeof(int64_t);
  static constexpr size_t kSmemBytes =
      kQBytes + kStages * kStageBytes + 2 * kConvBytes + kXchgBytes + 16 + kSlotBytes;
  static_assert(kSmemBytes <= 227 * 1024, "");
};

// The warp-specialized wgmma variant (FP8 cache, sm_90a; mla_decode_ws.cuh): 3 warpgroups. WG 2
// (the producer) copies each tile's codes into a ring of kCodeStages code tiles and converts
// every tile ONCE into a ring of kConvStages FP16 core-matrix tiles (CfgWg's layout); WG 0 / 1
// (the consumers) read them with wgmma exactly as the wgmma variant does (S over half the dims
// each, swapped; O over 256 latent dims each). Handshakes by named barriers (kBar*).
struct CfgWs {
  static constexpr int kThreads = 384, kConsumerThreads = 256, kProducerThreads = 128;
  static constexpr int kTk = 32, kNT = kTk / 8;
  static constexpr int kCodeStages = 3, kConvStages = 2;
  static constexpr int kRowBytes = kQk;            // 576 codes per key
  static constexpr int kChunks = kRowBytes / 16;   // 36 copies of 16 B per key
  static constexpr int kLatentChunks = kCkv / 16;  // 32 of them from the latent pool
  static constexpr int kDimGroups = kQk / 8;
  // setmaxnreg: 2 x 224 + 56 = 3 x 168; with Q in registers for kQRegSteps of the 18 QK steps
  // (mla_decode_ws.cuh's kQRegs: 56 more per consumer) 2 x 232 + 40, no spills (ptxas, sm_90a;
  // 16 steps at 232 / 40 spill 32 B, all 18 at 240 / 24 spill 32 B in the producer).
  static constexpr int kConsumerRegs = 224, kProducerRegs = 56;
  static constexpr int kConsumerRegsQ = 232, kProducerRegsQ = 40, kQRegSteps = 14;
  // Named barrier ids (0 is __syncthreads): FP16 tile s full (producer arrives, consumers wait)
  // and empty (consumers arrive, producer waits), the consumers' S swap, the producer's slot ring.
  static constexpr int kBarFull = 1, kBarEmpty = kBarFull + kConvStages, kBarSwap = kBarEmpty + kConvStages,
                       kBarProducer = kBarSwap + 1;
  static constexpr size_t kQBytes = size_t(kHeadsPerCta) * kQk * 2;     // 73,728 (FP16, core matrices)
  static constexpr size_t kCodeBytes = size_t(kTk) * kRowBytes;         // 18,432
  static constexpr size_t kConvBytes = size_t(kTk) * kQk * 2;           // 36,864
  static constexpr size_t kXchgBytes = size_t(8) * kNT * 32 * 4 * sizeof(float);  // the consumers' 8 warps
  static constexpr size_t kSlotBytes = size_t(kCodeStages) * kTk * sizeof(int64_t);
  static constexpr size_t kSmemBytes =
      kQBytes + kCodeStages * kCodeBytes + kConvStages * kConvBytes + kXchgBytes + 16 + kSlotBytes;  // 220,176
  static_assert(kSmemBytes <= 227 * 1024, "");
  static_assert(kTk * kChunks % kProducerThreads == 0, "every producer thread copies the same number of chunks");
  static_assert(kCodeStages * kTk <= kProducerThreads, "one pass loads the first stages' slots");
  static_assert(kBarProducer <= 15, "");
  // setmaxnreg takes multiples of 8 in [24, 256], and the consumers' increase waits until the
  // producer's decrease has freed enough of the block's entry allocation: 384 threads x 168
  // (__launch_bounds__(384, 1): 65,536 / 384 rounded down to 8), so the split must not exceed it.
  static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;  // 168
  static_assert(kConsumerThreads * kConsumerRegs + kProducerThreads * kProducerRegs <= kThreads * kEntryRegs, "");
  static_assert(kConsumerThreads * kConsumerRegsQ + kProducerThreads * kProducerRegsQ <= kThreads * kEntryRegs, "");
  static_assert(kConsumerRegs % 8 == 0 && kProducerRegs % 8 == 0 && kConsumerRegsQ % 8 == 0 &&
                    kProducerRegsQ % 8 == 0 && kProducerRegs >= 24 && kProducerRegsQ >= 24 &&
                    kConsumerRegs <= 256 && kConsumerRegsQ <= 256,
                "");
  static_assert(kQRegSteps >= 1 && kQRegSteps <= kQk / 2 / 16, "");
};

// ws: the warp-specialized variant (FP8 cache only; `wgmma` is then implied).
inline size_t smem_bytes(bool fp8, bool wgmma = false, bool ws = false) {
  if (ws) return CfgWs::kSmemBytes;
  if (wgmma) return fp8 ? CfgWgFp8::kSmemBytes : CfgWg::kSmemBytes;
  return fp8 ? Cfg<true>::kSmemBytes : Cfg<false>::kSmemBytes;
}
inline int tile_keys(bool fp8, bool wgmma = false, bool ws = false) {
  return ws ? CfgWs::kTk : wgmma ? CfgWg::kTk : fp8 ? Cfg<true>::kTk : Cfg<false>::kTk;
}
// "" when the decode kernel (wgmma: its wgmma variant; ws: the warp-specialized one) can run `heads` heads with a BF16 or
// (fp8) FP8 E4M3 cache and softmax scale sm_scale on a device of compute capability `cc` (90 for
// sm_90) allowing `smem_optin` bytes of shared memory per block; else why not, one line.
// (Plain std::string: nvcc compiles this header into the kernels' translation units, where fmt's
// compile-time format strings do not build.)
inline std::string can_implement(int heads, bool fp8, float sm_scale, int64_t smem_optin, int cc, bool wgmma,
                                 bool ws = false) {
  if (ws && !fp8) return "MLA decode (wgmma-ws): an FP8 E4M3 cache only (a BF16 cache: the mma.sync / wgmma kernels)";
  if (heads < kHeadsPerCta || heads % kHeadsPerCta != 0)
    return "MLA decode (mma): " + std::to_string(heads) + " heads unsupported (a multiple of " +
           std::to_string(kHeadsPerCta) + ")";
  if (!(sm_scale > 0)) return "MLA decode (mma): sm_scale " + std::to_string(sm_scale) + " must be positive";
  const size_t need = smem_bytes(fp8, wgmma, ws);
  if (smem_optin < int64_t(need))
    return "MLA decode (mma): needs " + std::to_string(need) + " B of shared memory per block, this GPU allows " +
           std::to_string(smem_optin) + " B";
  if (cc < 89) return "MLA decode (mma): needs sm_89 or newer (E4M3 conversions)";
  if ((wgmma || ws) && cc != 90)
    return std::string(ws ? "MLA decode (wgmma-ws)" : "MLA decode (wgmma)") + ": needs sm_90 (Hopper's wgmma)";
  return "";
}

}  // namespace fp4moe::cuda::attention::decode
