// The CPU reference of one grouped expert GEMM, as cuda/moe_gemm computes it, on chosen rows
// (every GPU GEMM test and the tuner's profiler check against it, row by row):
//
//   acc[m, n] = act_scale · Σ_k xq[m, k] · W_e(m)[n, k]     (double sums; W dequantized with
//                                                             its global scale; e(m) from offsets)
//   y[m, :]   = acc (None) | SiLU(acc[m, j]) · acc[m, N/2 + j] (SiluMul, y has N/2 columns)
//             | acc · row_scale[m] (RowScale)
//
// xq = x (BF16), or with nvfp4_act the rows fake-quantized as Blackwell NVFP4 activations
// (format/fp4.hpp quantize_nvfp4 per row with the per-tensor global g = amax(x) / (6 · 448)
// over all m_total rows, dequantized without g) and act_scale = g: what the W4A4 emulation
// computes exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/gemm_epilogue.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe {

struct GroupedGemmRef {
  const ExpertStack* w = nullptr;       // FP4, E experts of [N, K]
  const uint16_t* x = nullptr;          // [m_total, K] bf16 bits
  int64_t m_total = 0;
  const int32_t* offsets = nullptr;     // [E+1] host: expert e owns rows [offsets[e], offsets[e+1])
  const float* row_scale = nullptr;     // [m_total] (RowScale)
  Epilogue epilogue = Epilogue::None;
  bool nvfp4_act = false;               // W4A4 emulation
};

// Columns of a reference row: N, or N / 2 with SiluMul.
int64_t reference_cols(const GroupedGemmRef& r);

// The sums behind a reference, before the epilogue, per row and weight row n ([rows, N]):
// acc = act_scale · Σ_k xq·W (as above) and abs_acc = act_scale · Σ_k |xq·W|, the magnitude an
// FP32 evaluation's summation error scales with (tests derive their error bounds from it).
struct GroupedGemmSums {
  std::vector<double> acc, abs_acc;
};

// The reference of `rows` (each in [0, offsets[E])), row i of the result = rows[i], each
// reference_cols(r) values. Parallel (default_num_threads() when threads == 0). With `sums`,
// also fills them.
std::vector<double> grouped_gemm_reference(const GroupedGemmRef& r, const std::vector<int64_t>& rows, int threads = 0,
                                           GroupedGemmSums* sums = nullptr);

// At most `count` rows of [0, offsets[E]) (all of them when count >= that): the first and the
// last row of up to count / 4 experts spread over those with rows (tile edges), and rows
// spread evenly over the whole range; ascending, no repeats.
std::vector<int64_t> sample_rows(const int32_t* offsets, int64_t num_experts, int64_t count);

// Per-row comparison of a result against the reference: for every row, ‖y − ref‖ / ‖ref‖ (the
// row's relative L2 error; ‖y − ref‖ alone where ‖ref‖ is 0) and whether every value is finite.
struct RowErrors {
  double worst = 0;         // the largest row error (+inf when a value is not finite)
  int64_t worst_row = -1;   // index into the compared rows
  int64_t bad_rows = 0;     // rows above `tol`, or not finite
};
RowErrors compare_rows(const std::vector<float>& got, const std::vector<double>& ref, int64_t cols, double tol);

}  // namespace fp4moe
