#include "cuda/embed/embed.hpp"
#include "cuda/embed/embed_rows_kernels.cuh"

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::embed {

// Rows go in the vector forms' grid y: at most 65,535 a launch.
constexpr int kMaxGridRows = 65535;

void embed_rows(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s) {
  if (T == 0) return;
  if (!embed_vec_ok(table, H, x)) return embed_rows_v0(table, f32_table, tokens, T, H, x, s);
  for (int t0 = 0; t0 < T; t0 += kMaxGridRows) {
    const dim3 grid(unsigned(row_copy_ctas(H / 4, kEmbedThreads)), unsigned(T - t0 < kMaxGridRows ? T - t0 : kMaxGridRows));
    if (f32_table)
      embed_vec_kernel<true><<<grid, kEmbedThreads, 0, s>>>(table, tokens + t0, H, x + int64_t(t0) * H);
    else
      embed_vec_kernel<false><<<grid, kEmbedThreads, 0, s>>>(table, tokens + t0, H, x + int64_t(t0) * H);
    FP4MOE_CUDA_CHECK_LAUNCH();
  }
}

void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s) {
  if (n == 0) return;
  if (!gather_vec_ok(src, dim, dst)) return gather_rows_v0(src, dim, rows, n, dst, s);
  for (int i0 = 0; i0 < n; i0 += kMaxGridRows) {
    const dim3 grid(unsigned(row_copy_ctas(dim / 8, kGatherThreads)), unsigned(n - i0 < kMaxGridRows ? n - i0 : kMaxGridRows));
    gather_vec_kernel<<<grid, kGatherThreads, 0, s>>>(src, dim, rows + i0, dst + int64_t(i0) * dim);
    FP4MOE_CUDA_CHECK_LAUNCH();
  }
}

void embed_rows_v0(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s) {
  if (T == 0) return;
  embed_kernel<<<T, kEmbedThreads, 0, s>>>(table, f32_table, tokens, H, x);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void gather_rows_v0(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s) {
  if (n == 0) return;
  gather_kernel<<<n, kGatherThreads, 0, s>>>(src, dim, rows, dst);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::embed
