// sample(): F32 logits [rows, vocab] -> one token per row (core/sampling_scheme.hpp's scheme), in
// three launches of the kernels of sample_f32_kernels.cuh.
#include <cstdint>

#include "cuda/sampling/sample_f32_kernels.cuh"
#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/sampling/sampling.hpp"

namespace fp4moe::cuda::sampling {
namespace {
using namespace detail;
}  // namespace

size_t sample_workspace_bytes(int64_t rows, int64_t vocab) {
  FP4MOE_CHECK(rows >= 0 && vocab >= 1, "sample_workspace_bytes({}, {})", rows, vocab);
  size_t bytes = 0;
  carve(nullptr, rows, vocab, &bytes);
  return bytes;
}

void sample(const SampleArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check_sample_args(a, workspace_bytes);
  if (a.rows == 0) return;
  const Geometry g = geometry(a.rows, a.vocab);
  const Workspace ws = carve(workspace, a.rows, a.vocab, nullptr);
  const bool vec = reinterpret_cast<uintptr_t>(a.logits) % 16 == 0 && a.logits_stride % 4 == 0;
  const dim3 grid(unsigned(g.chunks), unsigned(a.rows));
  stats_kernel<<<grid, kThreads, 0, stream>>>(a, ws, g, vec);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
  mass_kernel<<<grid, kThreads, 0, stream>>>(a, ws, g, vec);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
  finish_kernel<<<grid, kThreads, 0, stream>>>(a, ws, g, vec);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda::sampling
