// Grouped FP4 GEMM for MoE experts (host API; no CUDA types leak except cudaStream_t).
//
//   y[m, n] = sum_k x[m, k] * W_e[n, k] * global_e     for rows m of expert e
//
// x is [M_total, K] BF16, rows already permuted so expert e owns rows
// [expert_offsets[e], expert_offsets[e+1]) (offsets live on the DEVICE, E+1 ints, so
// no host synchronisation is needed). W is NVFP4 (or MXFP4) [E, N, K/2] + scales
// [E, N, K/block] + FP32 globals [E], in the kernel's re-laid device layout
// (see prepare_weights). y is [M_total, N] BF16 (or [M_total, N/2] with SiluMul).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

enum class ActFormat : uint8_t { BF16, NVFP4_EMULATED };  // W4A16, or W4A4 (Blackwell numerics)

enum class Epilogue : uint8_t {
  None,     // y = acc * global
  SiluMul,  // N = 2I, rows [0,I) gate, [I,2I) up (halves, as checkpoints store them):
            // y[m, j] = SiLU(gate[m, j]) * up[m, j], y is [M_total, I]
  RowScale, // y[m, n] = acc * global * row_scale[m]  (routing weight of that row)
};

// What must be computed.
struct MoeGemmDesc {
  int num_experts = 0;
  int n = 0;            // output features (2I for gate_up)
  int k = 0;            // reduction dim
  int max_tokens = 0;   // upper bound of M_total (workspace sizing)
  WeightFormat weight = WeightFormat::NVFP4;
  ActFormat act = ActFormat::BF16;
  Epilogue epilogue = Epilogue::None;
};
std::ostream& operator<<(std::ostream&, const MoeGemmDesc&);

// Which implementation runs it.
enum class GemmKernel : uint8_t {
  Sm90Wgmma,       // sm_90a: FP4 weights decoded to BF16 registers (wgmma A), tokens via TMA
  Sm90Decode,      // sm_90a+: weight-streaming variant for few tokens per expert (split-K)
  DequantCublas,   // baseline: dequantize hit experts to BF16, cuBLAS(Lt) per expert
  Generic,         // fallback for any shape / arch (slow, simple)
};

// How it is computed.
struct TileConfig {
  GemmKernel kernel = GemmKernel::Generic;
  int block_m = 0;   // weight rows (GEMM N) per CTA
  int block_n = 0;   // tokens per CTA
  int block_k = 0;
  int stages = 0;
  int split_k = 1;
  int cluster = 1;
};
std::ostream& operator<<(std::ostream&, const TileConfig&);
std::string to_string(const TileConfig&);

// Device pointers for one call.
struct MoeGemmArgs {
  const void* x = nullptr;               // [M_total, K] bf16 (or NVFP4 for W4A4: see act_* below)
  const int32_t* expert_offsets = nullptr;  // [E+1] device
  const void* weight = nullptr;          // prepared weights (prepare_weights)
  const float* row_scale = nullptr;      // [M_total] for Epilogue::RowScale
  void* y = nullptr;                     // [M_total, N or N/2] bf16
  int m_total = 0;                       // rows of x actually valid (<= desc.max_tokens) —
                                         // may be an upper bound; offsets decide
  void* workspace = nullptr;             // workspace_bytes(desc, cfg) bytes, or null if 0
  cudaStream_t stream = nullptr;
};

}  // namespace fp4moe::cuda
