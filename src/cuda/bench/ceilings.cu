// The ceilings every benchmark is judged against, measured in the same run:
// copy bandwidth (a 2 GiB D2D copy, read + write bytes), BF16 and FP8 dense peaks (cuBLASLt
// 8192^3 on random data). Plus the device-side random fills and the cold-L2 timer.
#include "cuda/bench/bench_util.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe::cuda::bench {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float stddev) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64((seed << 40) ^ (i * 0x9E3779B97F4A7C15ull + 1));
    // Sum of 4 uniforms (Irwin-Hall), centred and scaled to unit variance: close to normal.
    float s = 0;
    for (int j = 0; j < 4; ++j) s += float((r >> (16 * j)) & 0xFFFF) * (1.0f / 65536.0f);
    p[i] = __float2bfloat16_rn((s - 2.0f) * 1.7320508f * stddev);
  }
}

__global__ void fill_u8_kernel(uint8_t* p, size_t n, uint64_t seed, uint32_t lo, uint32_t span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64((seed << 40) ^ (i * 0x9E3779B97F4A7C15ull + 1));
    p[i] = uint8_t(lo + uint32_t(r % span));
  }
}

__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64((seed << 40) ^ (i * 0x9E3779B97F4A7C15ull + 1));
    p[i] = lo + (hi - lo) * float(r >> 40) * (1.0f / 16777216.0f);
  }
}

// Reads n 16-byte words (the read flush); the xor of all of them is written only when it equals
// a constant, which keeps the loads without a store per thread.
__global__ void read_flush_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

constexpr int kFillThreads = 256;
constexpr unsigned kFillBlocks = 132 * 8;

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void fill_random_bf16(void* p, size_t n, uint64_t seed, float stddev, cudaStream_t s) {
  fill_bf16_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed, stddev);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void fill_random_u8(void* p, size_t n, uint64_t seed, uint32_t lo, uint32_t hi, cudaStream_t s) {
  fill_u8_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(static_cast<uint8_t*>(p), n, seed, lo, hi - lo + 1);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void fill_random_f32(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  fill_f32_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(p, n, seed, lo, hi);
  FP4MOE_CUDA_CHECK_LAUNCH();
}


// ---- cold-L2 timer ----------------------------------------------------------------------

L2Flush l2_flush_from(const std::string& name) {
  FP4MOE_CHECK(name == "read" || name == "write", "--l2-flush {}: read or write", name);
  return name == "read" ? L2Flush::kRead : L2Flush::kWrite;
}

ColdL2Timer::ColdL2Timer(cudaStream_t stream, L2Flush flush, size_t flush_bytes)
    : stream_(stream), flush_(flush_bytes), sink_(sizeof(uint32_t)), mode_(flush) {
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(flush_.ptr(), 0, flush_.bytes(), stream_));  // defined bytes to read
}

void ColdL2Timer::flush_l2(int i) {
  if (mode_ == L2Flush::kWrite) {
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(flush_.ptr(), i & 0xFF, flush_.bytes(), stream_));
    return;
  }
  read_flush_kernel<<<kFillBlocks, kFillThreads, 0, stream_>>>(static_cast<const uint4*>(flush_.ptr()),
                                                               flush_.bytes() / sizeof(uint4),
                                                               static_cast<uint32_t*>(sink_.ptr()));
  FP4MOE_CUDA_CHECK_LAUNCH();
}

ColdL2Timer::~ColdL2Timer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

ColdL2Timer::Result ColdL2Timer::time(const std::function<void()>& fn, int iters, int warmup, double budget_ms,
                                      int min_iters) {
  while (events_.size() < 2) {
    cudaEvent_t e;
    FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  for (int i = 0; i < warmup; ++i) fn();
  // One timed probe decides how many iterations fit the budget.
  flush_l2(0);
  FP4MOE_CUDA_CHECK(cudaEventRecord(events_[0], stream_));
  fn();
  FP4MOE_CUDA_CHECK(cudaEventRecord(events_[1], stream_));
  FP4MOE_CUDA_CHECK(cudaEventSynchronize(events_[1]));
  float probe = 0;
  FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&probe, events_[0], events_[1]));
  int n = iters;
  if (probe * iters > budget_ms) n = std::max(min_iters, int(budget_ms / std::max(probe, 1e-3f)));
  n = std::min(n, iters);
  while (events_.size() < size_t(2 * n)) {
    cudaEvent_t e;
    FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  for (int i = 0; i < n; ++i) {
    flush_l2(i);
    FP4MOE_CUDA_CHECK(cudaEventRecord(events_[size_t(2 * i)], stream_));
    fn();
    FP4MOE_CUDA_CHECK(cudaEventRecord(events_[size_t(2 * i + 1)], stream_));
  }
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<float> ms(static_cast<size_t>(n), 0.0f);
  for (int i = 0; i < n; ++i)
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], events_[size_t(2 * i)], events_[size_t(2 * i + 1)]));
  Result r;
  r.iters = n;
  r.median_us = median(std::vector<double>(ms.begin(), ms.end())) * 1e3;
  r.min_us = *std::min_element(ms.begin(), ms.end()) * 1e3;
  r.max_us = *std::max_element(ms.begin(), ms.end()) * 1e3;
  return r;
}

// ---- ceilings ------------------------------------------------------------------------------

namespace {
// TFLOP/s of one cuBLASLt n^3 GEMM (TN, FP32 accumulate, BF16 out) with inputs of `in_type`;
// 0 when cuBLASLt has no algorithm for it.
double gemm_tflops(cublasLtHandle_t lt, cudaDataType_t in_type, const void* ma, const void* mb, void* md, void* ws,
                   size_t ws_bytes, int64_t n, int iters, cudaStream_t s) {
  cublasLtMatmulDesc_t mm;
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&mm, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtMatrixLayout_t la, lb, ld;
  FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, in_type, uint64_t(n), uint64_t(n), n));
  FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, in_type, uint64_t(n), uint64_t(n), n));
  FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, uint64_t(n), uint64_t(n), n));
  cublasLtMatmulPreference_t pref;
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsb = ws_bytes;
  FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
  cublasLtMatmulHeuristicResult_t res{};
  int count = 0;
  double tflops = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, mm, la, lb, ld, ld, pref, 1, &res, &count) == CUBLAS_STATUS_SUCCESS &&
      count > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    ColdL2Timer t(s);
    const auto r = t.time([&] {
      FP4MOE_CUBLAS_CHECK(cublasLtMatmul(lt, mm, &alpha, ma, la, mb, lb, &beta, md, ld, md, ld, &res.algo, ws,
                                         ws_bytes, s));
    }, 2 * iters, 3);
    tflops = 2.0 * double(n) * double(n) * double(n) / (r.median_us * 1e-6) / 1e12;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(mm);
  return tflops;
}
}  // namespace

Ceilings measure_ceilings(cudaStream_t s, int iters) {
  Ceilings c;
  c.copy_bytes = int64_t(2) << 30;
  c.gemm_size = 8192;
  DeviceBuffer a(size_t(c.copy_bytes));
  {
    DeviceBuffer b(size_t(c.copy_bytes));
    fill_random_u8(a.ptr(), a.bytes(), 1, 0, 255, s);
    ColdL2Timer t(s);
    const auto r = t.time(
        [&] { FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b.ptr(), a.ptr(), a.bytes(), cudaMemcpyDeviceToDevice, s)); }, iters, 2);
    c.copy_gbps = 2.0 * double(c.copy_bytes) / (r.median_us * 1e-6) / 1e9;
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  // BF16 8192^3: A, B random in the first 3 x 128 MiB of `a`, D after them.
  const int64_t n = c.gemm_size;
  auto* base = a.as<uint8_t>();
  void* ma = base;
  void* mb = base + n * n * 2;
  void* md = base + 2 * n * n * 2;
  fill_random_bf16(ma, size_t(n * n), 2, 1.0f, s);
  fill_random_bf16(mb, size_t(n * n), 3, 1.0f, s);
  cublasLtHandle_t lt;
  FP4MOE_CUBLAS_CHECK(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = base + 3 * n * n * 2;
  c.bf16_tflops = gemm_tflops(lt, CUDA_R_16BF, ma, mb, md, ws, ws_bytes, n, iters, s);
  // FP8 E4M3 on random codes of both signs in [0.0625, 4] (no NaN).
  fill_random_u8(ma, size_t(n * n), 4, 0x20, 0x48, s);
  fill_random_u8(mb, size_t(n * n), 5, 0xA0, 0xC8, s);
  c.fp8_tflops = gemm_tflops(lt, CUDA_R_8F_E4M3, ma, mb, md, ws, ws_bytes, n, iters, s);
  cublasLtDestroy(lt);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  return c;
}

}  // namespace fp4moe::cuda::bench
