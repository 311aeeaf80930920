// Block-scale decode tables for the CPU kernels: one 256-entry float table per matrix, so
// that a block's effective scale is a single load (scale code -> decoded scale * global).
#pragma once

#include <array>
#include <cstdint>

#include "format/fp4.hpp"

namespace fp4moe::cpu {

// table[c] = decode(c) * global_scale  (E4M3 for NVFP4, E8M0 for MXFP4, global 1), decoded
// with format/codecs.hpp's tables.
using ScaleTable = std::array<float, 256>;
ScaleTable make_scale_table(Fp4Format format, float global_scale);

}  // namespace fp4moe::cpu
