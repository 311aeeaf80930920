// Row norms of the model runner, any dims (launch only, graph capturable): RMSNorm with FP32
// math from FP32 or BF16 rows to BF16 rows, and the indexer key's LayerNorm with bias over BF16
// rows. One CTA per row; RMSNorm keeps the row in registers (all its loads in flight at once,
// norm_bf16_kernels.cuh). CPU reference: cpu/row_ops_cpu.hpp (rms_norm_rows_cpu,
// layer_norm_rows_cpu); checked by tests/ops (backend_ops_test on the GPU, backend_ops_emu_test
// through the CUDA emulator).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda::norm {

// y = RMSNorm(x) · w (FP32 math), x FP32 or BF16 with a row stride, y BF16 with a row stride.
void rms_norm(const float* x, int64_t x_stride, int rows, int dim, const float* w, float eps, uint16_t* y,
              int64_t y_stride, cudaStream_t s);
void rms_norm(const uint16_t* x, int64_t x_stride, int rows, int dim, const float* w, float eps, uint16_t* y,
              int64_t y_stride, cudaStream_t s);
// The previous RMSNorm (a strided loop per thread, two passes over x), for `fp4moe bench rows`
// before / after only; the engine does not use it.
void rms_norm_v0(const float* x, int64_t x_stride, int rows, int dim, const float* w, float eps, uint16_t* y,
                 int64_t y_stride, cudaStream_t s);
void rms_norm_v0(const uint16_t* x, int64_t x_stride, int rows, int dim, const float* w, float eps, uint16_t* y,
                 int64_t y_stride, cudaStream_t s);
// y = LayerNorm(x) · w + b over contiguous BF16 rows (in place allowed).
void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y,
                cudaStream_t s);

}  // namespace fp4moe::cuda::norm
