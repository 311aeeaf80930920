// NVFP4 / MXFP4 block-scaled 4-bit weights: views, quantize (ModelOpt semantics), dequantize.
//
// Layout (both formats): `packed` is [rows, cols/2] bytes, element 2j in the LOW nibble
// of byte j, element 2j+1 in the high nibble; E2M1 code: bit 3 sign, bits 2..0 magnitude
// index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}. `scales` is [rows, cols/block] bytes:
//   NVFP4: block 16, E4M3 (fn) scale; value = e2m1 * e4m3(scale) * global_scale
//          where global_scale is ModelOpt's `weight_scale_2` = amax / (6 * 448).
//   MXFP4: block 32, E8M0 scale (2^(s-127)); global_scale is 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace fp4moe {

enum class Fp4Format : uint8_t { NVFP4, MXFP4 };

constexpr int fp4_block_size(Fp4Format f) { return f == Fp4Format::NVFP4 ? 16 : 32; }
std::string_view fp4_format_name(Fp4Format f);  // "nvfp4" | "mxfp4"

// Non-owning view of one FP4 matrix [rows, cols] (cols along K, the reduction dim).
struct Fp4MatrixView {
  Fp4Format format = Fp4Format::NVFP4;
  int64_t rows = 0, cols = 0;
  const uint8_t* packed = nullptr;  // [rows, cols/2]
  const uint8_t* scales = nullptr;  // [rows, cols/block]
  float global_scale = 1.0f;        // NVFP4 weight_scale_2; 1 for MXFP4
};

// Owning FP4 matrix.
struct Fp4Matrix {
  Fp4Format format = Fp4Format::NVFP4;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scales;
  float global_scale = 1.0f;
  Fp4MatrixView view() const { return {format, rows, cols, packed.data(), scales.data(), global_scale}; }
};

// ModelOpt's per-tensor scale: amax / (6 * 448).
float nvfp4_global_scale_from_amax(float amax);

// Quantize a row-major float matrix. cols must be a multiple of the block size.
// global_scale: NVFP4 weight_scale_2 to use (e.g. shared by gate and up); when empty it is
// computed from this matrix's amax.
Fp4Matrix quantize_nvfp4(const float* w, int64_t rows, int64_t cols,
                         std::optional<float> global_scale = std::nullopt);
Fp4Matrix quantize_mxfp4(const float* w, int64_t rows, int64_t cols);

// Decode rows [row_begin, row_end) into out[(r - row_begin) * cols + c] (float / bf16 bits).
// Vectorized; the global scale is applied.
void dequantize_rows(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, float* out);
void dequantize_rows_bf16(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, uint16_t* out);

}  // namespace fp4moe
