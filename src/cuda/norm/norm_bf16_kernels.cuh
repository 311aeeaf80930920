// The kernels behind norm.hpp (FP32 sums). Kernels only: norm_bf16.cu launches them,
// tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
//
// RMSNorm has two forms, one CTA per row each:
//   rms_norm_reg_kernel  (the launch's choice for dims up to kRmsRegMaxChunks · 512 · V: 16,384 FP32,
//       32,768 BF16): the
//       row is cut into chunks of V = 16 B / sizeof(In) values (4 FP32, 8 BF16); a thread loads
//       its chunks (at most kRmsRegMaxChunks) into registers up front — one 16-byte load each
//       where the row is 16-byte aligned, V scalar loads for an unaligned row or the tail past
//       the last whole chunk — so every load of the row is in flight at once, then the weights
//       (their loads too before the sum), then the block sum, then the outputs from the registers (no second read of x). The CTA
//       has just enough warps for its chunks (rms_norm_reg_threads).
//   rms_norm_strided_kernel (dims past that, and `rms_norm_v0` for the bench): each thread walks
//       the row in a strided loop twice (the sum, then the outputs).
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::norm {

// CTA sizes of the launches (also the emulator's).
inline constexpr int kRmsNormThreads = 256;  // the strided form
inline constexpr int kLayerNormThreads = 128;
inline constexpr int kRmsRegMaxChunks = 8;         // chunks per thread in registers, at most
inline constexpr int kRmsRegTargetChunks = 4;      // chunks per thread the CTA size aims at
inline constexpr int kRmsRegMaxThreads = 512;  // 128 registers a thread: x and w chunks fit

// Values per 16-byte chunk.
template <typename In>
constexpr int rms_chunk_values() {
  return int(16 / sizeof(In));
}
// The register form's CTA size for a row of `dim` values: enough warps for kRmsRegTargetChunks
// chunks per thread, 32 .. kRmsRegMaxThreads threads; 0 when the row needs more than
// kRmsRegMaxChunks chunks per thread at kRmsRegMaxThreads (the strided form then).
template <typename In>
constexpr int rms_norm_reg_threads(int dim) {
  const int chunks = (dim + rms_chunk_values<In>() - 1) / rms_chunk_values<In>();
  int t = ((chunks + kRmsRegTargetChunks - 1) / kRmsRegTargetChunks + 31) / 32 * 32;
  t = t < 32 ? 32 : t > kRmsRegMaxThreads ? kRmsRegMaxThreads : t;
  return (chunks + t - 1) / t <= kRmsRegMaxChunks ? t : 0;
}

// The launch's choice (host side; norm_bf16.cu and the emulator's launch use it): threads 0 is
// the strided form, else the register form with that CTA size and the alignment flags.
struct RmsNormLaunch {
  int threads = 0;
  int chunks = 0;  // the kernel's chunks per thread: 4 (every GLM-5 norm) or 8 (fewer registers with 4)
  bool x_vec = false, y_vec = false, w_vec = false;
};
inline bool rms_aligned(const void* p, int64_t stride_bytes, int64_t to) {
  return reinterpret_cast<uintptr_t>(p) % uint64_t(to) == 0 && stride_bytes % to == 0;
}
template <typename In>
RmsNormLaunch rms_norm_launch(const In* x, int64_t xs, int dim, const float* w, const uint16_t* y, int64_t ys) {
  constexpr int V = rms_chunk_values<In>();
  RmsNormLaunch l;
  l.threads = rms_norm_reg_threads<In>(dim);
  if (l.threads > 0) {
    const int chunks = (dim + V - 1) / V, per = (chunks + l.threads - 1) / l.threads;
    l.chunks = per <= kRmsRegTargetChunks ? kRmsRegTargetChunks : kRmsRegMaxChunks;
  }
  l.x_vec = rms_aligned(x, xs * int64_t(sizeof(In)), 16);
  l.y_vec = rms_aligned(y, ys * 2, 2 * V);
  l.w_vec = rms_aligned(w, 0, 16);
  return l;
}

namespace {

using rowprims::block_sum;
using rowprims::ld;
using rowprims::st;

// Value j (0 .. V-1) of a chunk held as four 32-bit words.
__device__ __forceinline__ float chunk_value(const uint4& c, int j, const float*) {
  const unsigned w = j == 0 ? c.x : j == 1 ? c.y : j == 2 ? c.z : c.w;
  return __uint_as_float(w);
}
__device__ __forceinline__ float chunk_value(const uint4& c, int j, const uint16_t*) {
  const unsigned w = (j >> 1) == 0 ? c.x : (j >> 1) == 1 ? c.y : (j >> 1) == 2 ? c.z : c.w;
  return prims::bf16_bits_to_float((j & 1) ? (w >> 16) : (w & 0xffffu));
}
__device__ __forceinline__ void chunk_set(uint4& c, int j, const float* p) {
  const unsigned w = __float_as_uint(*p);
  if (j == 0) c.x = w; else if (j == 1) c.y = w; else if (j == 2) c.z = w; else c.w = w;
}
__device__ __forceinline__ void chunk_set(uint4& c, int j, const uint16_t* p) {
  const unsigned h = unsigned(*p) << ((j & 1) * 16);
  if ((j >> 1) == 0) c.x |= h; else if ((j >> 1) == 1) c.y |= h; else if ((j >> 1) == 2) c.z |= h; else c.w |= h;
}

// x_vec: every row of x starts 16-byte aligned (x and the row stride); y_vec: every row of y
// starts aligned to V · 2 bytes; w_vec: w is 16-byte aligned. blockDim.x = rms_norm_reg_threads,
// kChunks >= the chunks per thread (RmsNormLaunch::chunks).
template <typename In, int kChunks>
__global__ void __launch_bounds__(kRmsRegMaxThreads)
    rms_norm_reg_kernel(const In* x, int64_t xs, int dim, const float* w, float eps, uint16_t* y, int64_t ys, bool x_vec,
                        bool y_vec, bool w_vec) {
  constexpr int V = rms_chunk_values<In>(), WQ = V / 4;  // WQ: 16-byte words of weights per chunk
  const In* xr = x + int64_t(blockIdx.x) * xs;
  const int chunks = (dim + V - 1) / V, full = dim / V;  // chunks [0, full) are whole
  const int nt = int(blockDim.x), t = int(threadIdx.x);
  uint4 c[kChunks];       // chunk t + k · nt of x: V values, raw bits (0 past dim)
  float4 wc[kChunks][WQ];  // its weights (0 past dim)
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int ci = t + k * nt;
    c[k] = uint4{0u, 0u, 0u, 0u};
    if (ci < chunks) {
      if (x_vec && ci < full) {
        c[k] = *reinterpret_cast<const uint4*>(xr + int64_t(ci) * V);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (ci * V + j < dim) chunk_set(c[k], j, xr + int64_t(ci) * V + j);
      }
    }
  }
  // The weights' loads go out before the sum, so that their latency hides behind it.
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int ci = t + k * nt, i0 = ci * V;
#pragma unroll
    for (int q = 0; q < WQ; ++q) {
      wc[k][q] = float4{0.0f, 0.0f, 0.0f, 0.0f};
      if (ci >= chunks) continue;
      if (w_vec && ci < full) {
        wc[k][q] = *reinterpret_cast<const float4*>(w + i0 + 4 * q);
      } else {
        const int i = i0 + 4 * q;
        wc[k][q] = float4{i < dim ? w[i] : 0.0f, i + 1 < dim ? w[i + 1] : 0.0f, i + 2 < dim ? w[i + 2] : 0.0f,
                          i + 3 < dim ? w[i + 3] : 0.0f};
      }
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = chunk_value(c[k], j, xr);
      ss += v * v;
    }
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  uint16_t* yr = y + int64_t(blockIdx.x) * ys;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int ci = t + k * nt;
    if (ci >= chunks) continue;
    const int i0 = ci * V;
    float wv[V];
#pragma unroll
    for (int q = 0; q < WQ; ++q)
      wv[4 * q] = wc[k][q].x, wv[4 * q + 1] = wc[k][q].y, wv[4 * q + 2] = wc[k][q].z, wv[4 * q + 3] = wc[k][q].w;
    if (y_vec && ci < full) {
      uint32_t o[V / 2];
#pragma unroll
      for (int j = 0; j < V / 2; ++j)
        o[j] = prims::pack_bf16x2(wv[2 * j] * (chunk_value(c[k], 2 * j, xr) * inv),
                                  wv[2 * j + 1] * (chunk_value(c[k], 2 * j + 1, xr) * inv));
      if constexpr (V == 8)
        *reinterpret_cast<uint4*>(yr + i0) = uint4{o[0], o[1], o[2], o[3]};
      else
        *reinterpret_cast<uint2*>(yr + i0) = uint2{o[0], o[1]};
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (i0 + j < dim) st(yr, i0 + j, wv[j] * (chunk_value(c[k], j, xr) * inv));
    }
  }
}

template <typename In>
__global__ void rms_norm_strided_kernel(const In* x, int64_t xs, int dim, const float* w, float eps, uint16_t* y,
                                        int64_t ys) {
  const In* xr = x + int64_t(blockIdx.x) * xs;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = ld(xr, i);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  uint16_t* yr = y + int64_t(blockIdx.x) * ys;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) st(yr, i, w[i] * (ld(xr, i) * inv));
}

__global__ void layer_norm_kernel(const uint16_t* x, int dim, const float* w, const float* b, float eps, uint16_t* y) {
  const uint16_t* xr = x + int64_t(blockIdx.x) * dim;
  float s = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) s += ld(xr, i);
  const float mean = block_sum(s) / float(dim);
  float v = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) v += (ld(xr, i) - mean) * (ld(xr, i) - mean);
  const float inv = 1.0f / sqrtf(block_sum(v) / float(dim) + eps);
  uint16_t* yr = y + int64_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) st(yr, i, (ld(xr, i) - mean) * inv * w[i] + b[i]);
}

}  // namespace
}  // namespace fp4moe::cuda::norm
