// The backend-ops table (ops_cases.hpp) on the GPU: every row through the CUDA launch functions
// of src/cuda (norm, rope, embed, elementwise, attention/mla_warp_bf16,
// indexer/indexer_score_warp_bf16, permute/dense_combine_f32, sampling/argmax_f32,
// sampling/token_bitmask_f32, step), plus the GPU-sized rows (GLM-5's dims, loops past their grid caps). Any arch the build targets;
// skips without a GPU. backend_ops_emu_test runs the small rows through the CUDA emulator in CI.
#include <gtest/gtest.h>

#include "cuda/attention/mla_warp_bf16.hpp"
#include "cuda/attention/mla_warp_fp8.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/elementwise/elementwise.hpp"
#include "cuda/embed/embed.hpp"
#include "cuda/indexer/indexer_score_warp_bf16.hpp"
#include "cuda/indexer/indexer_score_warp_fp8.hpp"
#include "cuda/norm/norm.hpp"
#include "cuda/permute/dense_combine_f32.hpp"
#include "cuda/rope/rope.hpp"
#include "cuda/sampling/argmax_f32.hpp"
#include "cuda/sampling/token_bitmask_f32.hpp"
#include "cuda/step/step.hpp"
#include "gpu_test.hpp"
#include "ops/ops_cases.hpp"

namespace fp4moe::test::ops {
namespace {

namespace cu = fp4moe::cuda;

// Each op: its launch function on the default stream; down() synchronises.
struct GpuBackend {
  template <class T>
  struct Buf {
    cu::DeviceBuffer d;
    size_t n = 0;
    T* p() const { return d.as<T>(); }
  };
  template <class T>
  static Buf<T> up(const std::vector<T>& v) {
    return {cu::DeviceBuffer::from(v), v.size()};
  }
  template <class T>
  static std::vector<T> down(const Buf<T>& b) {
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    return b.d.template download<T>(b.n);
  }

  template <class In>
  static void rms_norm(const In* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys) {
    cu::norm::rms_norm(x, xs, rows, dim, w, eps, y, ys, nullptr);
  }
  template <class In>
  static void rms_norm_v0(const In* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys) {
    cu::norm::rms_norm_v0(x, xs, rows, dim, w, eps, y, ys, nullptr);
  }
  static void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y) {
    cu::norm::layer_norm(x, rows, dim, w, b, eps, y, nullptr);
  }
  static void rope(uint16_t* x, int T, int heads, int64_t ts, int64_t hs, int offset, int rope_dim,
                   const int32_t* positions, const float* inv_freq, float af, bool interleaved) {
    cu::rope::rope(x, T, heads, ts, hs, offset, rope_dim, positions, inv_freq, af, interleaved, nullptr);
  }
  static void embed_rows_v0(const void* table, bool f32, const int32_t* tokens, int T, int H, float* x) {
    cu::embed::embed_rows_v0(table, f32, tokens, T, H, x, nullptr);
  }
  static void gather_rows_v0(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst) {
    cu::embed::gather_rows_v0(src, dim, rows, n, dst, nullptr);
  }
  static void embed_rows(const void* table, bool f32, const int32_t* tokens, int T, int H, float* x) {
    cu::embed::embed_rows(table, f32, tokens, T, H, x, nullptr);
  }
  static void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst) {
    cu::embed::gather_rows(src, dim, rows, n, dst, nullptr);
  }
  static void silu_mul(const uint16_t* g, int64_t gs, const uint16_t* u, int64_t us, uint16_t* h, int rows, int n) {
    cu::elementwise::silu_mul(g, gs, u, us, h, rows, n, nullptr);
  }
  template <class T>
  static void add_into(float* x, const T* o, int64_t n) {
    cu::elementwise::add_into(x, o, n, nullptr);
  }
  static void bf16_to_f32_scaled(const uint16_t* x, float* y, int64_t n, float scale) {
    cu::elementwise::bf16_to_f32_scaled(x, y, n, scale, nullptr);
  }
  static void f32_to_bf16(const float* x, uint16_t* y, int64_t n) { cu::elementwise::f32_to_bf16(x, y, n, nullptr); }
  static void moe_dense_combine_f32(const float* y, const int32_t* ids, const float* wts, const float* shared, int T,
                                    int k, int H, float* out) {
    cu::moe_dense_combine_f32(y, ids, wts, shared, T, k, H, out, nullptr);
  }
  static size_t argmax_workspace_bytes() { return cu::sampling::argmax_rows_f32_workspace_bytes(); }
  static void argmax_rows_f32(const float* logits, int rows, int vocab, int32_t* out, void* ws = nullptr,
                              size_t ws_bytes = 0) {
    cu::sampling::argmax_rows_f32(logits, rows, vocab, out, ws, ws_bytes, nullptr);
  }
  static void argmax_rows_f32_v0(const float* logits, int rows, int vocab, int32_t* out) {
    cu::sampling::argmax_rows_f32_v0(logits, rows, vocab, out, nullptr);
  }
  static void apply_token_bitmask_f32(float* logits, int64_t stride, int rows, int vocab, const int32_t* slot,
                                      const uint32_t* masks, int64_t words) {
    cu::sampling::apply_token_bitmask_f32(logits, stride, rows, vocab, slot, masks, words, nullptr);
  }
  static void count_experts(const int32_t* ids, int T, int k, const int32_t* req, const int32_t* active, int E,
                            int32_t* counts) {
    cu::step::count_experts(ids, T, k, req, active, E, counts, nullptr);
  }
  static void chunk_qo_indptr(const int32_t* qo, int32_t R, int32_t r0, int32_t n, int32_t* out) {
    cu::step::chunk_qo_indptr(qo, R, r0, n, out, nullptr);
  }
  static void greedy_advance(const cpu::GreedyAdvanceArgs& a, int32_t step) { cu::step::greedy_advance(a, step, nullptr); }
  static void spec_accept_greedy(const cpu::SpecAcceptArgs& a) { cu::step::spec_accept_greedy(a, nullptr); }
  static void copy_indexed_i32(int32_t* dst, const int32_t* di, const int32_t* src, const int32_t* si, int32_t n) {
    cu::step::copy_indexed_i32(dst, di, src, si, n, nullptr);
  }
  static void kv_append_bf16(const KvLayerView& L, const cu::DeviceBatch& b, const uint16_t* ckv, int64_t cs,
                             const uint16_t* kpe, int64_t ks, const uint16_t* ik) {
    cu::attention::kv_append_bf16(L, b, ckv, cs, kpe, ks, ik, nullptr);
  }
  static void mla_attention_warp_bf16(const uint16_t* ql, const uint16_t* qp, int64_t pts, int64_t phs,
                                      const KvLayerView& L, const cu::DeviceBatch& b, int heads, float scale,
                                      const int32_t* topk, int topk_k, uint16_t* out) {
    cu::attention::mla_attention_warp_bf16(ql, qp, pts, phs, L, b, heads, scale, topk, topk_k, out, nullptr);
  }
  static void kv_append_fp8(const KvLayerView& L, const cu::DeviceBatch& b, const uint16_t* ckv, int64_t cs,
                            const uint16_t* kpe, int64_t ks, const uint16_t* ik) {
    cu::attention::kv_append_fp8(L, b, ckv, cs, kpe, ks, ik, nullptr);
  }
  static void mla_attention_warp_fp8(const uint16_t* ql, const uint16_t* qp, int64_t pts, int64_t phs,
                                     const KvLayerView& L, const cu::DeviceBatch& b, int heads, float scale,
                                     const int32_t* topk, int topk_k, uint16_t* out) {
    cu::attention::mla_attention_warp_fp8(ql, qp, pts, phs, L, b, heads, scale, topk, topk_k, out, nullptr);
  }
  static void indexer_scores_warp_fp8(const uint16_t* q, const float* w, const KvLayerView& L, const cu::DeviceBatch& b,
                                      int heads, int dim, float scale, int max_ctx, float* scores, int64_t stride) {
    cu::indexer::indexer_scores_warp_fp8(q, w, L, b, heads, dim, scale, max_ctx, scores, stride, nullptr);
  }
  static void indexer_scores_warp_bf16(const uint16_t* q, const float* w, const KvLayerView& L, const cu::DeviceBatch& b,
                                       int heads, int dim, float scale, int max_ctx, float* scores, int64_t stride) {
    cu::indexer::indexer_scores_warp_bf16(q, w, L, b, heads, dim, scale, max_ctx, scores, stride, nullptr);
  }
};

std::vector<std::string> row_names() {
  std::vector<std::string> n;
  for (const OpRow& r : op_rows<GpuBackend>(true)) n.push_back(r.name);
  return n;
}

class BackendOpsGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOpsGpu, MatchesTheCpuReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (const OpRow& r : op_rows<GpuBackend>(true))
    if (r.name == GetParam()) return r.run();
  FAIL() << "no row " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOpsGpu, ::testing::ValuesIn(row_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The greedy argmax's split form in a captured graph (the runner's decode graphs): one capture at
// B 1 and one at B 7 on GLM-5's vocab, each replayed over new logits three times; every replay
// equals the CPU reference and leaves the workspace all zeros (the next replay's counter).
TEST(BackendOpsGpuGraph, SplitArgmaxReplaysWithNewLogits) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const int V = 154880;
  for (int rows : {1, 7}) {
    cudaStream_t s;
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cu::DeviceBuffer logits(size_t(rows) * V * 4), out(size_t(rows) * 4),
        ws(cu::sampling::argmax_rows_f32_workspace_bytes());
    FP4MOE_CUDA_CHECK(cudaMemset(ws.ptr(), 0, ws.bytes()));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cu::sampling::argmax_rows_f32(logits.as<float>(), rows, V, out.as<int32_t>(), ws.ptr(), ws.bytes(), s);
    FP4MOE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    Rng rng(200 + uint64_t(rows));
    for (int replay = 0; replay < 3; ++replay) {
      std::vector<float> l = rand_f32(rng, size_t(rows) * V, -10.0f, 10.0f);
      for (int r = 0; r < rows; ++r) {  // a tie across slices in every row: the lower id wins
        const int a = rng.integer(0, V / 2), b = rng.integer(V / 2, V - 1);
        l[size_t(r) * V + size_t(a)] = l[size_t(r) * V + size_t(b)] = 20.0f + float(replay);
      }
      logits.upload(l);
      FP4MOE_CUDA_CHECK(cudaGraphLaunch(ge, s));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<int32_t> ref(static_cast<size_t>(rows));
      cpu::argmax_rows_cpu(l.data(), rows, V, ref.data());
      expect_equal("argmax_rows_f32 (graph replay " + std::to_string(replay) + ")", out.download<int32_t>(size_t(rows)),
                   ref);
      const std::vector<uint8_t> w = ws.download<uint8_t>(ws.bytes());
      ASSERT_EQ(size_t(std::count(w.begin(), w.end(), uint8_t(0))), w.size()) << "the workspace after a replay";
    }
    FP4MOE_CUDA_CHECK(cudaGraphExecDestroy(ge));
    FP4MOE_CUDA_CHECK(cudaGraphDestroy(g));
    FP4MOE_CUDA_CHECK(cudaStreamDestroy(s));
  }
}

}  // namespace
}  // namespace fp4moe::test::ops
