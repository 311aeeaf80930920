// The backend-ops table (ops_cases.hpp) with the kernels run on the CPU through the CUDA
// emulator (tests/cuda/emu): the same kernel bodies and launch shapes the launch functions use,
// so CI (no GPU) checks each op's arithmetic and indexing against its CPU reference.
// backend_ops_test runs the same rows (and GPU-sized ones) through the launch functions on a GPU.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
// The kernels are nvcc code: argmax's `threadIdx.x < s` compares unsigned with int there too.
#pragma GCC diagnostic ignored "-Wsign-compare"
#include "cuda/attention/mla_warp_bf16_kernels.cuh"
#include "cuda/elementwise/elementwise_bf16_f32_kernels.cuh"
#include "cuda/embed/embed_rows_kernels.cuh"
#include "cuda/indexer/indexer_score_warp_bf16_kernels.cuh"
#include "cuda/norm/norm_bf16_kernels.cuh"
#include "cuda/permute/dense_combine_f32_kernels.cuh"
#include "cuda/rope/rope_bf16_kernels.cuh"
#include "cuda/sampling/argmax_f32_kernels.cuh"
#include "cuda/sampling/token_bitmask_f32_kernels.cuh"
#include "cuda/step/step_kernels.cuh"

#include <gtest/gtest.h>

#include "ops/ops_cases.hpp"

namespace fp4moe::test::ops {
namespace {

namespace cu = fp4moe::cuda;

// Each op: the launch function's grid, block and shared memory (the families' constants), the
// kernel run by emu::launch. Host memory stands in for device memory.
struct EmuBackend {
  template <class T>
  struct Buf {
    std::vector<T> v;
    T* p() { return v.data(); }
  };
  template <class T>
  static Buf<T> up(const std::vector<T>& v) {
    return {v};
  }
  template <class T>
  static std::vector<T> down(const Buf<T>& b) {
    return b.v;
  }

  template <class In>
  static void rms_norm(const In* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys) {
    if (rows == 0) return;
    const cu::norm::RmsNormLaunch l = cu::norm::rms_norm_launch(x, xs, dim, w, y, ys);
    if (l.threads == 0)
      rms_norm_v0(x, xs, rows, dim, w, eps, y, ys);
    else if (l.chunks == cu::norm::kRmsRegTargetChunks)
      emu::launch(dim3(rows), dim3(l.threads), 0, cu::norm::rms_norm_reg_kernel<In, cu::norm::kRmsRegTargetChunks>, x, xs,
                  dim, w, eps, y, ys, l.x_vec, l.y_vec, l.w_vec);
    else
      emu::launch(dim3(rows), dim3(l.threads), 0, cu::norm::rms_norm_reg_kernel<In, cu::norm::kRmsRegMaxChunks>, x, xs,
                  dim, w, eps, y, ys, l.x_vec, l.y_vec, l.w_vec);
  }
  template <class In>
  static void rms_norm_v0(const In* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys) {
    if (rows == 0) return;
    emu::launch(dim3(rows), dim3(cu::norm::kRmsNormThreads), 0, cu::norm::rms_norm_strided_kernel<In>, x, xs, dim, w, eps,
                y, ys);
  }
  static void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y) {
    if (rows == 0) return;
    emu::launch(dim3(rows), dim3(cu::norm::kLayerNormThreads), 0, cu::norm::layer_norm_kernel, x, dim, w, b, eps, y);
  }
  static void rope(uint16_t* x, int T, int heads, int64_t ts, int64_t hs, int offset, int rope_dim,
                   const int32_t* positions, const float* inv_freq, float af, bool interleaved) {
    if (T == 0 || rope_dim == 0) return;
    emu::launch(dim3(T), dim3(cu::rope::kRopeThreads), 0, cu::rope::rope_kernel, x, heads, ts, hs, offset, rope_dim / 2,
                positions, inv_freq, af, interleaved);
  }
  static void embed_rows_v0(const void* table, bool f32, const int32_t* tokens, int T, int H, float* x) {
    if (T == 0) return;
    emu::launch(dim3(T), dim3(cu::embed::kEmbedThreads), 0, cu::embed::embed_kernel, table, f32, tokens, H, x);
  }
  static void gather_rows_v0(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst) {
    if (n == 0) return;
    emu::launch(dim3(n), dim3(cu::embed::kGatherThreads), 0, cu::embed::gather_kernel, src, dim, rows, dst);
  }
  static void embed_rows(const void* table, bool f32, const int32_t* tokens, int T, int H, float* x) {
    if (T == 0) return;
    namespace em = cu::embed;
    if (!em::embed_vec_ok(table, H, x))
      emu::launch(dim3(T), dim3(em::kEmbedThreads), 0, em::embed_kernel, table, f32, tokens, H, x);
    else if (f32)
      emu::launch(dim3(em::row_copy_ctas(H / 4, em::kEmbedThreads), T), dim3(em::kEmbedThreads), 0,
                  em::embed_vec_kernel<true>, table, tokens, H, x);
    else
      emu::launch(dim3(em::row_copy_ctas(H / 4, em::kEmbedThreads), T), dim3(em::kEmbedThreads), 0,
                  em::embed_vec_kernel<false>, table, tokens, H, x);
  }
  static void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst) {
    if (n == 0) return;
    namespace em = cu::embed;
    if (!em::gather_vec_ok(src, dim, dst))
      emu::launch(dim3(n), dim3(em::kGatherThreads), 0, em::gather_kernel, src, dim, rows, dst);
    else
      emu::launch(dim3(em::row_copy_ctas(dim / 8, em::kGatherThreads), n), dim3(em::kGatherThreads), 0,
                  em::gather_vec_kernel, src, dim, rows, dst);
  }
  static void silu_mul(const uint16_t* g, int64_t gs, const uint16_t* u, int64_t us, uint16_t* h, int rows, int n) {
    if (rows == 0) return;
    emu::launch(dim3(cu::elementwise::silu_mul_grid_x(n), rows), dim3(cu::elementwise::kThreads), 0,
                cu::elementwise::silu_mul_kernel, g, gs, u, us, h, n);
  }
  template <class T>
  static void add_into(float* x, const T* o, int64_t n) {
    if (n == 0) return;
    emu::launch(dim3(cu::elementwise::grid_1d(n)), dim3(cu::elementwise::kThreads), 0, cu::elementwise::add_kernel<T>, x,
                o, n);
  }
  static void bf16_to_f32_scaled(const uint16_t* x, float* y, int64_t n, float scale) {
    if (n == 0) return;
    emu::launch(dim3(cu::elementwise::grid_1d(n)), dim3(cu::elementwise::kThreads), 0, cu::elementwise::to_f32_kernel, x,
                y, n, scale);
  }
  static void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
    if (n == 0) return;
    emu::launch(dim3(cu::elementwise::grid_1d(n)), dim3(cu::elementwise::kThreads), 0, cu::elementwise::to_bf16_kernel, x,
                y, n);
  }
  static void moe_dense_combine_f32(const float* y, const int32_t* ids, const float* wts, const float* shared, int T,
                                    int k, int H, float* out) {
    if (T == 0) return;
    emu::launch(dim3(T), dim3(cu::densecombine::kDenseCombineThreads), 0, cu::densecombine::combine_kernel, y, ids, wts,
                shared, T, k, H, out);
  }
  static size_t argmax_workspace_bytes() { return cu::sampling::argmax::argmax_workspace_bytes_max(); }
  static void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, void* ws = nullptr, size_t = 0) {
    if (rows == 0) return;
    namespace am = cu::sampling::argmax;
    const int slices = ws ? am::argmax_slices(rows, vocab) : 1;
    emu::launch(dim3(slices, rows), dim3(am::kArgmaxThreads), 0, am::argmax_split_kernel, logits, vocab, out,
                slices == 1 ? nullptr : ws);
  }
  static void argmax_rows_f32_v0(const float* logits, int rows, int vocab, int32_t* out) {
    if (rows == 0) return;
    namespace am = cu::sampling::argmax;
    emu::launch(dim3(rows), dim3(am::kArgmaxV0Threads), 0, am::argmax_kernel_v0, logits, vocab, out);
  }
  static void apply_token_bitmask_f32(float* logits, int64_t stride, int rows, int vocab, const int32_t* slot,
                                      const uint32_t* masks, int64_t words) {
    if (rows == 0) return;
    namespace tm = cu::sampling::tokenmask;
    emu::launch(dim3(tm::mask_grid_x(vocab), rows), dim3(tm::kMaskThreads), 0, tm::token_bitmask_kernel, logits, stride,
                vocab, slot, masks, words);
  }
  static void count_experts(const int32_t* ids, int T, int k, const int32_t* req, const int32_t* active, int E,
                            int32_t* counts) {
    emu::launch(dim3(1), dim3(cu::step::kCountExpertsThreads), size_t(E) * 4, cu::step::count_experts_kernel, ids, T, k,
                req, active, E, counts);
  }
  static void chunk_qo_indptr(const int32_t* qo, int32_t R, int32_t r0, int32_t n, int32_t* out) {
    emu::launch(dim3(1), dim3(cu::step::kChunkQoThreads), 0, cu::step::chunk_qo_indptr_kernel, qo, R, r0, n, out);
  }
  static void greedy_advance(const cpu::GreedyAdvanceArgs& a, int32_t step) {
    if (a.requests == 0) return;
    const int threads = cu::step::kGreedyAdvanceThreads;
    emu::launch(dim3((a.requests + threads - 1) / threads), dim3(threads), 0, cu::step::greedy_advance_kernel, a, step);
  }
  static void spec_accept_greedy(const cpu::SpecAcceptArgs& a) {
    if (a.requests == 0) return;
    const int threads = cu::step::kSpecAcceptThreads;
    emu::launch(dim3((a.requests + threads - 1) / threads), dim3(threads), 0, cu::step::spec_accept_greedy_kernel, a);
  }
  static void copy_indexed_i32(int32_t* dst, const int32_t* di, const int32_t* src, const int32_t* si, int32_t n) {
    if (n <= 0) return;
    const int threads = cu::step::kCopyIndexedThreads;
    emu::launch(dim3((n + threads - 1) / threads), dim3(threads), 0, cu::step::copy_indexed_i32_kernel, dst, di, src, si, n);
  }
  static void kv_append_bf16(const KvLayerView& L, const cu::DeviceBatch& b, const uint16_t* ckv, int64_t cs,
                             const uint16_t* kpe, int64_t ks, const uint16_t* ik) {
    if (b.tokens == 0) return;
    emu::launch(dim3(b.tokens), dim3(cu::attention::mlawarp::kKvAppendRunnerThreads), 0,
                cu::attention::mlawarp::kv_append_kernel<false>, L, b, ckv, cs, kpe, ks, ik);
  }
  static void mla_attention_warp_bf16(const uint16_t* ql, const uint16_t* qp, int64_t pts, int64_t phs,
                                      const KvLayerView& L, const cu::DeviceBatch& b, int heads, float scale,
                                      const int32_t* topk, int topk_k, uint16_t* out) {
    if (b.tokens == 0) return;
    emu::launch(dim3(b.tokens, heads), dim3(cu::attention::mlawarp::kAttnWarps * 32), 0, cu::attention::mlawarp::mla_kernel<false>,
                ql, qp, pts, phs, L, b, heads, scale, topk, topk_k, out);
  }
  static void kv_append_fp8(const KvLayerView& L, const cu::DeviceBatch& b, const uint16_t* ckv, int64_t cs,
                            const uint16_t* kpe, int64_t ks, const uint16_t* ik) {
    if (b.tokens == 0) return;
    emu::launch(dim3(b.tokens), dim3(cu::attention::mlawarp::kKvAppendRunnerThreads), 0,
                cu::attention::mlawarp::kv_append_kernel<true>, L, b, ckv, cs, kpe, ks, ik);
  }
  static void mla_attention_warp_fp8(const uint16_t* ql, const uint16_t* qp, int64_t pts, int64_t phs,
                                     const KvLayerView& L, const cu::DeviceBatch& b, int heads, float scale,
                                     const int32_t* topk, int topk_k, uint16_t* out) {
    if (b.tokens == 0) return;
    emu::launch(dim3(b.tokens, heads), dim3(cu::attention::mlawarp::kAttnWarps * 32), 0, cu::attention::mlawarp::mla_kernel<true>,
                ql, qp, pts, phs, L, b, heads, scale, topk, topk_k, out);
  }
  static void indexer_scores_warp_fp8(const uint16_t* q, const float* w, const KvLayerView& L, const cu::DeviceBatch& b,
                                      int heads, int dim, float scale, int max_ctx, float* scores, int64_t stride) {
    if (b.tokens == 0) return;
    constexpr int kKeys = cu::indexer::scorewarp::kIdxKeysPerBlock;
    emu::launch(dim3(b.tokens, (max_ctx + kKeys - 1) / kKeys), dim3(cu::indexer::kScoreWarpThreads),
                cu::indexer::score_warp_smem_bytes(heads, dim), cu::indexer::scorewarp::indexer_kernel<true>, q, w, L, b, heads,
                dim, scale, scores, stride);
  }
  static void indexer_scores_warp_bf16(const uint16_t* q, const float* w, const KvLayerView& L, const cu::DeviceBatch& b,
                                       int heads, int dim, float scale, int max_ctx, float* scores, int64_t stride) {
    if (b.tokens == 0) return;
    constexpr int kKeys = cu::indexer::scorewarp::kIdxKeysPerBlock;
    emu::launch(dim3(b.tokens, (max_ctx + kKeys - 1) / kKeys), dim3(cu::indexer::kScoreWarpThreads),
                cu::indexer::score_warp_smem_bytes(heads, dim), cu::indexer::scorewarp::indexer_kernel<false>, q, w, L, b, heads,
                dim, scale, scores, stride);
  }
};

std::vector<std::string> row_names() {
  std::vector<std::string> n;
  for (const OpRow& r : op_rows<EmuBackend>(false)) n.push_back(r.name);
  return n;
}

class BackendOpsEmu : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOpsEmu, MatchesTheCpuReference) {
  for (const OpRow& r : op_rows<EmuBackend>(false))
    if (r.name == GetParam()) return r.run();
  FAIL() << "no row " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOpsEmu, ::testing::ValuesIn(row_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace fp4moe::test::ops
