// Elementwise ops of the model runner (launch only, graph capturable): SiLU(gate)·up of a dense
// MLP, residual adds into the FP32 stream, BF16 <-> FP32 copies. Grid-stride loops of 256
// threads. CPU reference: cpu/row_ops_cpu.hpp; checked by tests/ops.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::elementwise {

// h[r, i] = SiLU(g[r, i]) · u[r, i]: g at g + r·g_stride, u at u + r·u_stride, h [rows, n].
void silu_mul(const uint16_t* g, int64_t g_stride, const uint16_t* u, int64_t u_stride, uint16_t* h, int rows, int n,
              cudaStream_t s);
// x[i] += o[i] (n values).
void add_into(float* x, const uint16_t* o, int64_t n, cudaStream_t s);
void add_into(float* x, const float* o, int64_t n, cudaStream_t s);
// y[i] = FP32(x[i]) · scale.
void bf16_to_f32_scaled(const uint16_t* x, float* y, int64_t n, float scale, cudaStream_t s);
// BF16 copy of FP32 values: y[i] = bf16(x[i]) (round to nearest even).
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);

}  // namespace fp4moe::cuda::elementwise
