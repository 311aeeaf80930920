// Block-scale decode tables for the CPU kernels: one 256-entry float table per matrix, so
// that a block's effective scale is a single load (scale code -> decoded scale * global).
#pragma once

#include <array>
#include <cstdint>

#include "format/fp4.hpp"

namespace fp4moe::cpu {

// E4M3 (fn: bias 7, max 448, no infinities, S.1111.111 is NaN) -> float, exact.
float e4m3_to_float(uint8_t code);
// E8M0 (2^(s - 127), 0xFF is NaN) -> float, exact (2^-127 is an FP32 subnormal).
float e8m0_to_float(uint8_t code);

// table[c] = decode(c) * global_scale  (E4M3 for NVFP4, E8M0 for MXFP4, global 1).
using ScaleTable = std::array<float, 256>;
ScaleTable make_scale_table(Fp4Format format, float global_scale);

}  // namespace fp4moe::cpu
