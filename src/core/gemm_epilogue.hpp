// The epilogue of a grouped expert GEMM: what happens to the FP32 accumulator of output row m
// before it is stored. One enum for the CPU reference (cpu/grouped_gemm_ref.hpp), the kernels'
// descriptions (cuda/moe_gemm/moe_gemm_types.hpp) and the sm_90a kernels, whose template / kernel
// parameter is int(Epilogue) (sm90_grouped_common.cuh): the values are fixed.
#pragma once

#include <cstdint>

namespace fp4moe {

enum class Epilogue : uint8_t {
  None = 0,      // y = acc * global
  SiluMul = 1,   // N = 2I, rows [0,I) gate, [I,2I) up (halves, as checkpoints store them):
                 // y[m, j] = SiLU(gate[m, j]) * up[m, j], y is [M_total, I]
  RowScale = 2,  // y[m, n] = acc * global * row_scale[m]  (routing weight of that row)
};

}  // namespace fp4moe
