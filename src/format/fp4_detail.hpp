// Test hooks of format/fp4.cpp: switch its AVX2 kernels off to run the portable scalar
// paths (quantize and dequantize give identical bytes either way; the tests check that).
#pragma once

namespace fp4moe::detail {

void set_fp4_simd_enabled(bool enabled);  // process-wide; default on
bool fp4_simd_active();                   // AVX2 kernels in use (enabled and supported)

}  // namespace fp4moe::detail
