// The cuBLASLt / cuBLAS handles (see blas.hpp).
#include "cuda/linear/blas.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::linear {

#define FP4MOE_LT_CHECK(stmt)                                                                  \
  do {                                                                                         \
    const cublasStatus_t st_ = (stmt);                                                         \
    FP4MOE_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt: {} failed ({})", #stmt, int(st_));   \
  } while (0)

struct Blas::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Blas::Blas() : ws_(kWorkspaceBytes), ws_blas_(kWorkspaceBytes) {
  cublasLtHandle_t lt = nullptr;
  FP4MOE_LT_CHECK(cublasLtCreate(&lt));
  lt_ = lt;
  cublasHandle_t h = nullptr;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
  blas_ = h;
  FP4MOE_CUBLAS_CHECK(cublasSetWorkspace(h, ws_blas_.ptr(), ws_blas_.bytes()));
  FP4MOE_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
}

Blas::~Blas() {
  plans_.clear();
  if (blas_) cublasDestroy(static_cast<cublasHandle_t>(blas_));
  if (lt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
}

void Blas::gemm(const uint16_t* w, int N, int K, const uint16_t* x, int64_t ldx, int T, void* y, bool y_f32,
                int64_t ldy, cudaStream_t s) {
  if (T == 0) return;
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  auto key = std::make_tuple(N, K, T, ldx, ldy, y_f32);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto p = std::make_shared<Plan>();
    FP4MOE_LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FP4MOE_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FP4MOE_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Column-major: W [N, K] row-major is K × N (ld K), op T → N × K; x is K × T (ld ldx);
    // y is N × T (ld ldy) = row-major [T, N].
    FP4MOE_LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, K, N, K));
    FP4MOE_LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, K, T, ldx));
    FP4MOE_LT_CHECK(cublasLtMatrixLayoutCreate(&p->d, y_f32 ? CUDA_R_32F : CUDA_R_16BF, N, T, ldy));
    cublasLtMatmulPreference_t pref = nullptr;
    FP4MOE_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = kWorkspaceBytes;
    FP4MOE_LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), p->op, p->a, p->b,
                                                             p->d, p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    FP4MOE_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no algorithm for BF16 [{} x {}] x [{} rows]", N,
                 K, T);
    p->algo = res.algo;
    it = plans_.emplace(key, std::move(p)).first;
  }
  const Plan& p = *it->second;
  const float alpha = 1.0f, beta = 0.0f;
  FP4MOE_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p.op, &alpha, w, p.a, x, p.b, &beta, y, p.d, y,
                                 p.d, &p.algo, ws_.ptr(), ws_.bytes(), s));
}

void Blas::batched(bool a_t, int m, int n, int k, const void* A, int64_t lda, int64_t sA, const void* B, int64_t ldb,
                   int64_t sB, void* C, bool c_f32, int64_t ldc, int64_t sC, int batch, cudaStream_t s) {
  if (n == 0 || batch == 0) return;
  auto h = static_cast<cublasHandle_t>(blas_);
  FP4MOE_CUBLAS_CHECK(cublasSetStream(h, s));
  const float alpha = 1.0f, beta = 0.0f;
  FP4MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, a_t ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, A,
                                                 CUDA_R_16BF, int(lda), sA, B, CUDA_R_16BF, int(ldb), sB, &beta, C,
                                                 c_f32 ? CUDA_R_32F : CUDA_R_16BF, int(ldc), sC, batch,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace fp4moe::cuda::linear
