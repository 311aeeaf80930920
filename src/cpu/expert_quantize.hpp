// BF16 routed experts → NVFP4 at load: what the engine does to a checkpoint's BF16 MoE experts
// so that they take the FP4 grouped GEMM (the MTP layer of NVIDIA's NVFP4 checkpoints keeps its
// 256 routed experts in BF16; `--speculative-draft-model-quantization nvfp4`, the default).
//
// Format: the one the FP4 grouped GEMM reads (format/fp4.hpp, ModelOpt semantics): per expert
// ONE FP32 global scale amax / (6 · 448) over its whole matrix (w13: gate and up rows together,
// as the owned ExpertStack keeps one global per expert), 16-element blocks with an E4M3 scale
// e4m3(block_amax / (6 · global)), E2M1 codes round-to-nearest-even of x / (scale · global).
// Each expert is quantize_nvfp4 of its rows widened to FP32 (BF16 → FP32 is exact), so the
// bytes equal `fp4moe quantize`'s for the same matrix.
#pragma once

#include "format/moe_layer.hpp"

namespace fp4moe::cpu {

// An owned NVFP4 stack [E, n, k] of a BF16 stack (owned or view mode; view parts are stacked per
// expert in order). Experts run in parallel on `threads` threads (the caller's included).
// Throws fp4moe::Error (one line) for a stack that is not BF16, k not a multiple of 16, or a
// non-finite weight (naming the expert).
ExpertStack quantize_experts_nvfp4(const ExpertStack& bf16, int threads);

}  // namespace fp4moe::cpu
