// The vocabulary of the grouped expert GEMM, shared by the kernels (moe_gemm.hpp) and the tuner
// (src/tuner, which builds without CUDA and also lists Blackwell kernels no GPU here runs):
// what must be computed (MoeGemmDesc) and how (TileConfig: which kernel, which tile). Plain C++
// (no CUDA types): one description, used on both sides; the tuner calls a TileConfig a tactic.
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>

#include "core/gemm_epilogue.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

enum class ActFormat : uint8_t { BF16, NVFP4_EMULATED };  // W4A16, or W4A4 (Blackwell numerics)

using fp4moe::Epilogue;  // core/gemm_epilogue.hpp: one enum for the reference and the kernels

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

// Which implementation runs it.
enum class GemmKernel : uint8_t {
  Sm90Wgmma,       // sm_90a: FP4 weights decoded to BF16 registers (wgmma A), tokens via TMA
  Sm90Decode,      // sm_90a+: weight-streaming variant for few tokens per expert (split-K)
  DequantCublas,   // baseline: dequantize hit experts to BF16, cuBLAS(Lt) per expert
  Generic,         // fallback for any shape / arch (slow, simple)
  // Blackwell block-scaled NVFP4, W4A4 (cuda/moe_gemm_sm1xx, CUTLASS; compiled, not run):
  Sm100Tcgen05BlockScaled,    // sm_100a ptr-array grouped, tcgen05 kind::mxf4nvf4 (cluster 2: 2-SM tiles)
  Sm120MmaBlockScaled,        // sm_120a ptr-array grouped, mma.sync block_scale
  Sm100MoeDecodeBlockScaled,  // sm_100a, CUTLASS example 92: TMA weights, cp.async activations
};

// How it is computed.
struct TileConfig {
  GemmKernel kernel = GemmKernel::Generic;
  int block_m = 0;   // weight rows (GEMM N) per CTA (Blackwell: CUTLASS tile M, swap-AB orientation)
  int block_n = 0;   // tokens per CTA (Blackwell: CUTLASS tile N)
  int block_k = 0;   // elements along K
  int stages = 0;
  int split_k = 1;
  int cluster = 1;
  bool operator==(const TileConfig&) const = default;
};

inline const char* kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::Sm90Wgmma: return "sm90_wgmma";
    case GemmKernel::Sm90Decode: return "sm90_decode";
    case GemmKernel::DequantCublas: return "dequant_cublas";
    case GemmKernel::Generic: return "generic";
    case GemmKernel::Sm100Tcgen05BlockScaled: return "sm100_tcgen05_bs";
    case GemmKernel::Sm120MmaBlockScaled: return "sm120_mma_bs";
    case GemmKernel::Sm100MoeDecodeBlockScaled: return "sm100_moe_bs";
  }
  return "?";
}

// "sm90_decode_m128n8k64_s13" (what benchmarks and the layer print).
inline std::string to_string(const TileConfig& c) {
  std::ostringstream s;
  s << kernel_name(c.kernel) << "_m" << c.block_m << "n" << c.block_n << "k" << c.block_k << "_s" << c.stages;
  if (c.split_k != 1) s << "_splitk" << c.split_k;
  if (c.cluster != 1) s << "_c" << c.cluster;
  return s.str();
}
inline std::ostream& operator<<(std::ostream& os, const TileConfig& c) { return os << to_string(c); }

}  // namespace fp4moe::cuda
