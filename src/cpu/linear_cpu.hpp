// Dense linear layers on the CPU: y = x · Wᵀ with W [n, k] stored as NVFP4, MXFP4, BF16 or
// F32 and viewed in place (e.g. in an mmap'd checkpoint). FP32 activations and accumulation;
// FP4 rows are decoded in registers (avx2_weight_dot.hpp), never into a dequantized copy.
#pragma once

#include <cstdint>
#include <string_view>

#include "format/fp4.hpp"

namespace fp4moe::cpu {

enum class LinearFormat : uint8_t { NVFP4, MXFP4, BF16, F32 };
std::string_view linear_format_name(LinearFormat f);  // "nvfp4" | "mxfp4" | "bf16" | "f32"

struct LinearView {
  LinearFormat format = LinearFormat::BF16;
  int64_t n = 0, k = 0;
  const void* data = nullptr;       // BF16 (bits) / F32 [n, k]
  const uint8_t* packed = nullptr;  // FP4 [n, k/2]
  const uint8_t* scales = nullptr;  // FP4 [n, k/block] (E4M3 for NVFP4, E8M0 for MXFP4)
  float global_scale = 1.0f;        // NVFP4 weight_scale_2

  bool is_fp4() const { return format == LinearFormat::NVFP4 || format == LinearFormat::MXFP4; }
  int64_t block() const { return format == LinearFormat::NVFP4 ? 16 : 32; }
  LinearView rows(int64_t r0, int64_t r1) const;  // rows [r0, r1) of W
  size_t bytes() const;                           // bytes a pass over W reads
};

// y [T, n] = x [T, k] · Wᵀ. Parallel over blocks of output columns; each element is one
// FP32 dot product in a fixed order (results do not depend on the thread count).
void linear_cpu(const LinearView& w, const float* x, int64_t tokens, float* y, int threads = 0);
// The same with row strides (in floats): x row t at x + t·x_stride (>= k), y row t at
// y + t·y_stride (>= n).
void linear_strided_cpu(const LinearView& w, const float* x, int64_t x_stride, int64_t tokens, float* y,
                        int64_t y_stride, int threads = 0);

// Row r of W as FP32 [k] (FP4: dequantized with its scales).
void linear_row_cpu(const LinearView& w, int64_t r, float* out);

// y[t, :] += Σ_r x[t, r] · W[r, :] over every row r of w, for t < tokens (the transposed
// product; x row t at x + t·x_stride, y row t at y + t·y_stride). Each row of W is decoded
// once for all tokens. Serial.
void linear_t_accumulate_cpu(const LinearView& w, const float* x, int64_t x_stride, int64_t tokens, float* y,
                             int64_t y_stride);

}  // namespace fp4moe::cpu
