// The vocabulary of the grouped expert GEMM, shared by the kernels (moe_gemm.hpp) and the tuner
// (src/tuner, which builds without CUDA and also lists Blackwell kernels no GPU here runs):
// what must be computed (MoeGemmDesc) and how (TileConfig: which kernel, which tile). Plain C++
// (no CUDA types): one description, used on both sides; the tuner calls a TileConfig a tactic.
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>

#include "cpu/grouped_gemm_ref.hpp"
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

// Which implementation runs it.
enum class GemmKernel : uint8_t {
  Sm90Wgmma,       // sm_90a: FP4 weights decoded to BF16 registers (wgmma A), tokens via TMA
  Sm90Decode,      // sm_90a+: weight-streaming variant for few tokens per expert (split-K)
  DequantCublas,   // baseline: dequantize hit experts to BF16, cuBLAS(Lt) per expert
  Generic,         // fallback for any shape / arch (slow, simple)
  // Listed by the tuner for feasibility only: no kernel in fp4moe (no Blackwell GPU to run it).
  Sm100Tcgen05BlockScaled,  // CUTLASS-like tcgen05 kind::mxf4nvf4 kernel (sm_100/103)
  Sm120MmaBlockScaled,      // CUTLASS-like mma.sync block_scale kernel (sm_120/121)
};

// How it is computed.
struct TileConfig {
  GemmKernel kernel = GemmKernel::Generic;
  int block_m = 0;   // sm90: weight rows (GEMM N) per CTA; Blackwell listings: CUTLASS tile M (tokens)
  int block_n = 0;   // sm90: tokens per CTA;                Blackwell listings: CUTLASS tile N (weight rows)
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

// The CPU reference's name for an epilogue (cpu/grouped_gemm_ref.hpp, one layer below).
inline RefEpilogue ref_epilogue(Epilogue e) {
  return e == Epilogue::SiluMul    ? RefEpilogue::SiluMul
         : e == Epilogue::RowScale ? RefEpilogue::RowScale
                                   : RefEpilogue::None;
}

}  // namespace fp4moe::cuda
