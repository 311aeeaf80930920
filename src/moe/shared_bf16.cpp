// The BF16 shared expert on cuBLASLt: see shared_bf16.hpp.
#include "moe/shared_bf16.hpp"

#include <cublasLt.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/permute/permute.hpp"
#include "moe/expert_gemm.hpp"

namespace fp4moe::moe {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t(4) << 20;  // cuBLASLt's workspace (split-K etc.)
constexpr int kHeuristicAlgos = 8;
constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// y [T, N] (f32) = x [T, K] (bf16) · W [N, K]ᵀ (bf16), in cuBLASLt's column-major terms: W is
// K × N (ld K) taken transposed, x is K × T (ld K), y is N × T (ld N).
struct Layouts {
  cublasLtMatrixLayoutOpaque_t a{}, b{}, d{};
  Layouts(int64_t N, int64_t K, int64_t T) {
    FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&a, CUDA_R_16BF, uint64_t(K), uint64_t(N), K));
    FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&b, CUDA_R_16BF, uint64_t(K), uint64_t(T), K));
    FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&d, CUDA_R_32F, uint64_t(N), uint64_t(T), N));
  }
};

}  // namespace

struct SharedMlpBf16::Impl {
  int64_t H = 0, SI = 0, max_tokens = 0;
  cublasLtHandle_t lt = nullptr;
  mutable cublasLtMatmulDescOpaque_t op{};  // cuBLASLt takes it non-const; never written after construction
  cuda::DeviceBuffer w13, w2;  // bf16 [2·SI, H], [H, SI]
  std::vector<cublasLtMatmulAlgo_t> algo13, algo2;  // by tokens bucket

  // The first heuristic algorithm for the bucket's largest T that cuBLASLt also accepts for
  // its smallest (the algorithm then serves every T of the bucket).
  cublasLtMatmulAlgo_t pick(int64_t N, int64_t K, int64_t t_lo, int64_t t_hi) {
    cublasLtMatmulPreference_t pref = nullptr;
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = kLtWorkspaceBytes;
    FP4MOE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    // No in-place split-K: it orders its partial sums through counters in the workspace, and
    // the layer's workspace is overwritten by other layers' buffers between calls (whether
    // cuBLASLt re-zeroes them per call is not documented). The other schemes reduce in a
    // second kernel from partials written in the same call.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                             sizeof(schemes)));
    Layouts hi(N, K, t_hi), lo(N, K, t_lo);
    cublasLtMatmulHeuristicResult_t res[kHeuristicAlgos] = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, &op, &hi.a, &hi.b, &hi.d, &hi.d, pref,
                                                             kHeuristicAlgos, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                 "BF16 shared expert: cuBLASLt has no algorithm for [{} x {}] x {} tokens", N, K, t_hi);
    for (int i = 0; i < found; ++i) {
      cublasLtMatmulHeuristicResult_t check{};
      if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > kLtWorkspaceBytes) continue;
      if (cublasLtMatmulAlgoCheck(lt, &op, &lo.a, &lo.b, &lo.d, &lo.d, &res[i].algo, &check) !=
              CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > kLtWorkspaceBytes)
        continue;
      return res[i].algo;
    }
    FP4MOE_FAIL("BF16 shared expert: no cuBLASLt algorithm for [{} x {}] runs both {} and {} tokens", N, K, t_lo,
                t_hi);
  }

  void gemm(const cublasLtMatmulAlgo_t& algo, const void* w, int64_t N, int64_t K, const void* x, int64_t T, float* y,
            void* lt_ws, cudaStream_t s) const {
    Layouts L(N, K, T);
    const float alpha = 1.0f, beta = 0.0f;
    FP4MOE_CUBLAS_CHECK(cublasLtMatmul(lt, &op, &alpha, w, &L.a, x, &L.b, &beta, y, &L.d, y, &L.d, &algo, lt_ws,
                                       kLtWorkspaceBytes, s));
  }

  size_t gu_bytes(int64_t T) const { return align256(size_t(T * 2 * SI) * 4); }
  size_t h_bytes(int64_t T) const { return align256(size_t(T * SI) * 2); }
};

SharedMlpBf16::SharedMlpBf16(const ExpertStack& w13, const ExpertStack& w2, int64_t max_tokens)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  FP4MOE_CHECK(w13.format == WeightFormat::BF16 && w2.format == WeightFormat::BF16 && !w13.is_view() &&
                   !w2.is_view(),
               "BF16 shared expert: needs owned BF16 weights, got {} / {}", weight_format_name(w13.format),
               weight_format_name(w2.format));
  m.H = w13.k;
  m.SI = w13.n / 2;
  FP4MOE_CHECK(w13.num_experts == 1 && w2.num_experts == 1 && w13.n == 2 * m.SI && w2.n == m.H && w2.k == m.SI,
               "BF16 shared expert: gate_up [{}, {}, {}] and down [{}, {}, {}] do not make one MLP", w13.num_experts,
               w13.n, w13.k, w2.num_experts, w2.n, w2.k);
  FP4MOE_CHECK(m.SI > 0 && m.SI % 4 == 0 && m.H % 8 == 0,
               "BF16 shared expert: intermediate {} must be a multiple of 4 and hidden {} of 8", m.SI, m.H);
  FP4MOE_CHECK(w13.bf16.size() == size_t(2 * m.SI * m.H) && w2.bf16.size() == size_t(m.H * m.SI),
               "BF16 shared expert: {} / {} weights, expected {} / {}", w13.bf16.size(), w2.bf16.size(),
               2 * m.SI * m.H, m.H * m.SI);
  FP4MOE_CHECK(max_tokens >= 1, "BF16 shared expert: max_tokens = {}", max_tokens);
  m.max_tokens = max_tokens;
  m.w13 = cuda::DeviceBuffer::from(w13.bf16);
  m.w2 = cuda::DeviceBuffer::from(w2.bf16);
  FP4MOE_CUBLAS_CHECK(cublasLtCreate(&m.lt));
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescInit(&m.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&m.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&m.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  for (int b = 0; b <= tokens_bucket_index(max_tokens); ++b) {
    const int64_t hi = std::min<int64_t>(int64_t(1) << b, max_tokens), lo = b == 0 ? 1 : (int64_t(1) << (b - 1)) + 1;
    m.algo13.push_back(m.pick(2 * m.SI, m.H, std::min(lo, hi), hi));
    m.algo2.push_back(m.pick(m.H, m.SI, std::min(lo, hi), hi));
  }
}

SharedMlpBf16::~SharedMlpBf16() {
  if (impl_ && impl_->lt) cublasLtDestroy(impl_->lt);
}

size_t SharedMlpBf16::scratch_bytes(int64_t tokens) const {
  return impl_->gu_bytes(tokens) + impl_->h_bytes(tokens) + kLtWorkspaceBytes;
}

void SharedMlpBf16::run(const uint16_t* x, int64_t tokens, float* ys, void* scratch, cudaStream_t stream) const {
  const Impl& m = *impl_;
  FP4MOE_CHECK(tokens >= 0 && tokens <= m.max_tokens, "BF16 shared expert: {} tokens above the maximum of {}", tokens,
               m.max_tokens);
  if (tokens == 0) return;
  const size_t b = size_t(tokens_bucket_index(tokens));
  auto* base = static_cast<uint8_t*>(scratch);
  auto* gu = reinterpret_cast<float*>(base);
  auto* h = reinterpret_cast<uint16_t*>(base + m.gu_bytes(tokens));
  void* lt_ws = base + m.gu_bytes(tokens) + m.h_bytes(tokens);
  m.gemm(m.algo13[b], m.w13.ptr(), 2 * m.SI, m.H, x, tokens, gu, lt_ws, stream);
  cuda::silu_mul_rows(gu, int(tokens), int(m.SI), h, stream);
  m.gemm(m.algo2[b], m.w2.ptr(), m.H, m.SI, h, tokens, ys, lt_ws, stream);
}

size_t SharedMlpBf16::weight_bytes() const { return impl_->w13.bytes() + impl_->w2.bytes(); }

std::string SharedMlpBf16::describe() const {
  return fmt::format("bf16 cuBLASLt [{} x {}] + [{} x {}]", 2 * impl_->SI, impl_->H, impl_->H, impl_->SI);
}

}  // namespace fp4moe::moe
