#include "engine/gpu/gpu_kernels.hpp"

#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_prims.cuh"

namespace fp4moe::engine::gpu {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const uint16_t* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const bf16*>(p)[i]);
}
__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void st(uint16_t* p, int64_t i, float v) { reinterpret_cast<bf16*>(p)[i] = __float2bfloat16(v); }

using cuda::prims::warp_sum;

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_sum(v);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float x = lane < int(blockDim.x / 32) ? part[lane] : 0.0f;
    x = warp_sum(x);
    if (lane == 0) total = x;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

__device__ __forceinline__ int64_t slot_of(const DeviceBatch& b, int r, int pos) {
  const int ps = b.page_size;
  return int64_t(b.page_indices[b.page_indptr[r] + pos / ps]) * ps + pos % ps;
}

int blocks_for(int64_t n, int threads) { return int((n + threads - 1) / threads); }

__global__ void embed_kernel(const void* table, bool f32, const int32_t* tokens, int H, float* x) {
  const int t = blockIdx.x;
  const int64_t row = int64_t(tokens[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    x[int64_t(t) * H + i] = f32 ? static_cast<const float*>(table)[row + i] : ld(static_cast<const uint16_t*>(table), row + i);
}

template <typename In>
__global__ void rms_norm_kernel(const In* x, int64_t xs, int dim, const float* w, float eps, uint16_t* y, int64_t ys) {
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

__global__ void rope_kernel(uint16_t* x, int heads, int64_t ts, int64_t hs, int offset, int half, const int32_t* positions,
                            const float* inv_freq, float af, bool interleaved) {
  const int t = blockIdx.x;
  const float p = float(positions[t]);
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    bf16* v = reinterpret_cast<bf16*>(x + t * ts + h * hs + offset);
    const float a = inv_freq[i] * p;
    const float c = cosf(a) * af, sn = sinf(a) * af;
    const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float x0 = __bfloat162float(v[ia]), x1 = __bfloat162float(v[ib]);
    v[ia] = __float2bfloat16(x0 * c - x1 * sn);
    v[ib] = __float2bfloat16(x1 * c + x0 * sn);
  }
}

__global__ void kv_append_kernel(KvLayerView L, DeviceBatch b, const uint16_t* ckv, int64_t cs, const uint16_t* kpe,
                                 int64_t ks, const uint16_t* ik) {
  const int t = blockIdx.x;
  const int64_t slot = slot_of(b, b.token_req[t], b.positions[t]);
  if (slot < 0 || slot >= L.num_pages * L.page_size) return;
  uint16_t* dc = static_cast<uint16_t*>(L.ckv) + slot * L.ckv_dim;
  uint16_t* dk = static_cast<uint16_t*>(L.kpe) + slot * L.kpe_dim;
  for (int i = threadIdx.x; i < L.ckv_dim; i += blockDim.x) dc[i] = ckv[t * cs + i];
  for (int i = threadIdx.x; i < L.kpe_dim; i += blockDim.x) dk[i] = kpe[t * ks + i];
  if (ik && L.index_k) {
    uint16_t* di = static_cast<uint16_t*>(L.index_k) + slot * L.index_dim;
    for (int i = threadIdx.x; i < L.index_dim; i += blockDim.x) di[i] = ik[int64_t(t) * L.index_dim + i];
  }
}

constexpr int kAttnWarps = 4;
constexpr int kMaxC = 32;  // ckv_dim / 32 per lane (ckv_dim <= 1024)
constexpr int kMaxR = 4;   // kpe_dim / 32 per lane, rounded up (kpe_dim <= 128)

__global__ void __launch_bounds__(kAttnWarps * 32) mla_kernel(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pts,
                                                             int64_t phs, KvLayerView L, DeviceBatch b, int heads,
                                                             float scale, const int32_t* topk, int topk_k, uint16_t* out) {
  const int t = blockIdx.x, h = blockIdx.y, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int C = int(L.ckv_dim), R = int(L.kpe_dim), nc = C / 32;
  float q[kMaxC], qr[kMaxR], acc[kMaxC];
  const uint16_t* ql = q_lat + (int64_t(t) * heads + h) * C;
  const uint16_t* qp = q_pe + t * pts + h * phs;
#pragma unroll
  for (int i = 0; i < kMaxC; ++i) {
    q[i] = i < nc ? ld(ql, lane + 32 * i) : 0.0f;
    acc[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kMaxR; ++i) qr[i] = lane + 32 * i < R ? ld(qp, lane + 32 * i) : 0.0f;
  const int r = b.token_req[t], pos = b.positions[t];
  const int n = topk ? min(topk_k, pos + 1) : pos + 1;
  float m = -INFINITY, l = 0.0f;
  const uint16_t* ckv = static_cast<const uint16_t*>(L.ckv);
  const uint16_t* kpe = static_cast<const uint16_t*>(L.kpe);
  for (int j = w; j < n; j += kAttnWarps) {
    const int64_t slot = topk ? int64_t(topk[int64_t(t) * topk_k + j]) : slot_of(b, r, j);
    if (slot < 0) continue;
    const uint16_t* kc = ckv + slot * C;
    const uint16_t* kp = kpe + slot * R;
    float kv[kMaxC];
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxC; ++i) {
      kv[i] = i < nc ? ld(kc, lane + 32 * i) : 0.0f;
      d += q[i] * kv[i];
    }
#pragma unroll
    for (int i = 0; i < kMaxR; ++i)
      if (lane + 32 * i < R) d += qr[i] * ld(kp, lane + 32 * i);
    const float sc = warp_sum(d) * scale;
    const float mn = fmaxf(m, sc);
    const float corr = __expf(m - mn), p = __expf(sc - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxC; ++i) acc[i] = acc[i] * corr + p * kv[i];
    m = mn;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps];
  __shared__ float sacc[kAttnWarps][kMaxC * 32];
  if (lane == 0) {
    sm[w] = m;
    sl[w] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxC; ++i)
    if (i < nc) sacc[w][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < kAttnWarps; ++i) M = fmaxf(M, sm[i]);
  float Lsum = 0.0f;
  for (int i = 0; i < kAttnWarps; ++i) Lsum += sl[i] > 0.0f ? sl[i] * __expf(sm[i] - M) : 0.0f;
  uint16_t* o = out + (int64_t(t) * heads + h) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = 0.0f;
    for (int i = 0; i < kAttnWarps; ++i)
      if (sl[i] > 0.0f) v += sacc[i][c] * __expf(sm[i] - M);
    st(o, c, Lsum > 0.0f ? v / Lsum : 0.0f);
  }
}

constexpr int kIdxKeysPerBlock = 128;

__global__ void indexer_kernel(const uint16_t* q, const float* w, KvLayerView L, DeviceBatch b, int heads, int dim,
                               float scale, float* scores, int64_t stride) {
  extern __shared__ float sq[];  // [heads * dim] then w [heads]
  float* sw = sq + heads * dim;
  const int t = blockIdx.x, pos = b.positions[t], r = b.token_req[t];
  const int j0 = blockIdx.y * kIdxKeysPerBlock;
  if (j0 > pos) return;
  for (int i = threadIdx.x; i < heads * dim; i += blockDim.x) sq[i] = ld(q, int64_t(t) * heads * dim + i);
  for (int i = threadIdx.x; i < heads; i += blockDim.x) sw[i] = w[int64_t(t) * heads + i];
  __syncthreads();
  const int warps = blockDim.x / 32, wi = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint16_t* keys = static_cast<const uint16_t*>(L.index_k);
  for (int j = j0 + wi; j < min(j0 + kIdxKeysPerBlock, pos + 1); j += warps) {
    const uint16_t* k = keys + slot_of(b, r, j) * dim;
    float kv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) kv[i] = lane + 32 * i < dim ? ld(k, lane + 32 * i) : 0.0f;
    float s = 0.0f;
    for (int h = 0; h < heads; ++h) {
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lane + 32 * i < dim) d += sq[h * dim + lane + 32 * i] * kv[i];
      d = warp_sum(d);
      s += sw[h] * fmaxf(d * scale, 0.0f);
    }
    if (lane == 0) scores[int64_t(t) * stride + j] = s;
  }
}

__global__ void silu_mul_kernel(const uint16_t* g, int64_t gs, const uint16_t* u, int64_t us, uint16_t* h, int n) {
  const int r = blockIdx.y;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float a = ld(g, r * gs + i);
    st(h, int64_t(r) * n + i, a / (1.0f + __expf(-a)) * ld(u, r * us + i));
  }
}

template <typename T>
__global__ void add_kernel(float* x, const T* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += ld(o, i);
}

__global__ void to_f32_kernel(const uint16_t* x, float* y, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = ld(x, i) * scale;
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(y, i, x[i]);
}

__global__ void gather_kernel(const uint16_t* src, int dim, const int32_t* rows, uint16_t* dst) {
  const int64_t s = int64_t(rows[blockIdx.x]) * dim, d = int64_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[d + i] = src[s + i];
}

__global__ void combine_kernel(const float* y, const int32_t* ids, const float* wts, const float* shared, int T, int k,
                               int H, float* out) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float a = 0.0f;
    for (int j = 0; j < k; ++j) a += wts[t * k + j] * y[(int64_t(ids[t * k + j]) * T + t) * H + i];
    if (shared) a += shared[int64_t(t) * H + i];
    out[int64_t(t) * H + i] = a;
  }
}

__global__ void argmax_kernel(const float* logits, int V, int32_t* out) {
  const float* row = logits + int64_t(blockIdx.x) * V;
  float best = -INFINITY;
  int bi = -1;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = row[v];
    if (!isnan(x) && (bi < 0 || x > best)) best = x, bi = v;  // v increases: ties keep the lower id
  }
  __shared__ float sb[1024];
  __shared__ int si[1024];
  sb[threadIdx.x] = best;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ob = sb[threadIdx.x + s];
      const int oi = si[threadIdx.x + s];
      const int mi = si[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ob > sb[threadIdx.x] || (ob == sb[threadIdx.x] && oi < mi))) {
        sb[threadIdx.x] = ob;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0] < 0 ? 0 : si[0];
}

int grid_1d(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 4096)); }

}  // namespace

void embed_rows(const void* table, bool f32_table, const int32_t* tokens, int T, int H, float* x, cudaStream_t s) {
  if (T == 0) return;
  embed_kernel<<<T, 256, 0, s>>>(table, f32_table, tokens, H, x);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void rms_norm(const float* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
              cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_kernel<float><<<rows, 256, 0, s>>>(x, xs, dim, w, eps, y, ys);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void rms_norm(const uint16_t* x, int64_t xs, int rows, int dim, const float* w, float eps, uint16_t* y, int64_t ys,
              cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_kernel<uint16_t><<<rows, 256, 0, s>>>(x, xs, dim, w, eps, y, ys);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void layer_norm(const uint16_t* x, int rows, int dim, const float* w, const float* b, float eps, uint16_t* y,
                cudaStream_t s) {
  if (rows == 0) return;
  layer_norm_kernel<<<rows, 128, 0, s>>>(x, dim, w, b, eps, y);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void rope(uint16_t* x, int T, int heads, int64_t ts, int64_t hs, int offset, int rope_dim, const int32_t* positions,
          const float* inv_freq, float af, bool interleaved, cudaStream_t s) {
  if (T == 0 || rope_dim == 0) return;
  rope_kernel<<<T, 256, 0, s>>>(x, heads, ts, hs, offset, rope_dim / 2, positions, inv_freq, af, interleaved);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void kv_append_bf16(const KvLayerView& layer, const DeviceBatch& b, const uint16_t* ckv, int64_t cs,
                    const uint16_t* kpe, int64_t ks, const uint16_t* ik, cudaStream_t s) {
  FP4MOE_CHECK(layer.elem == KvElem::BF16 && (!layer.index_k || layer.index_elem == KvElem::BF16),
               "the GPU runner's cache append takes a BF16 cache");
  if (b.tokens == 0) return;
  kv_append_kernel<<<b.tokens, 128, 0, s>>>(layer, b, ckv, cs, kpe, ks, ik);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void mla_attention(const uint16_t* q_lat, const uint16_t* q_pe, int64_t pts, int64_t phs, const KvLayerView& layer,
                   const DeviceBatch& b, int heads, float sm_scale, const int32_t* topk, int topk_k, uint16_t* out,
                   cudaStream_t s) {
  FP4MOE_CHECK(layer.ckv_dim % 32 == 0 && layer.ckv_dim <= 32 * kMaxC && layer.kpe_dim <= 32 * kMaxR &&
                   layer.elem == KvElem::BF16,
               "MLA attention (runner kernel): latent {} (a multiple of 32, <= 1024) + rope {} (<= 128), BF16 cache",
               layer.ckv_dim, layer.kpe_dim);
  if (b.tokens == 0) return;
  mla_kernel<<<dim3(b.tokens, heads), kAttnWarps * 32, 0, s>>>(q_lat, q_pe, pts, phs, layer, b, heads, sm_scale, topk,
                                                                topk_k, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void indexer_scores(const uint16_t* q, const float* w, const KvLayerView& layer, const DeviceBatch& b, int heads,
                    int dim, float scale, int max_ctx, float* scores, int64_t stride, cudaStream_t s) {
  FP4MOE_CHECK(dim <= 128 && heads * dim <= 8192 && layer.index_k && layer.index_elem == KvElem::BF16,
               "indexer (runner kernel): {} heads x {} dims (dim <= 128, heads x dim <= 8192), BF16 keys", heads, dim);
  if (b.tokens == 0) return;
  const size_t smem = size_t(heads * dim + heads) * sizeof(float);
  static bool attr = false;
  if (!attr && smem > 48 * 1024) {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    attr = true;
  }
  indexer_kernel<<<dim3(b.tokens, (max_ctx + kIdxKeysPerBlock - 1) / kIdxKeysPerBlock), 256, smem, s>>>(
      q, w, layer, b, heads, dim, scale, scores, stride);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void silu_mul(const uint16_t* g, int64_t gs, const uint16_t* u, int64_t us, uint16_t* h, int rows, int n,
              cudaStream_t s) {
  if (rows == 0) return;
  silu_mul_kernel<<<dim3(std::min(blocks_for(n, 256), 64), rows), 256, 0, s>>>(g, gs, u, us, h, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void add_into(float* x, const uint16_t* o, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<uint16_t><<<grid_1d(n), 256, 0, s>>>(x, o, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void add_into(float* x, const float* o, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<float><<<grid_1d(n), 256, 0, s>>>(x, o, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void bf16_to_f32_scaled(const uint16_t* x, float* y, int64_t n, float scale, cudaStream_t s) {
  if (n == 0) return;
  to_f32_kernel<<<grid_1d(n), 256, 0, s>>>(x, y, n, scale);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_1d(n), 256, 0, s>>>(x, y, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void gather_rows(const uint16_t* src, int dim, const int32_t* rows, int n, uint16_t* dst, cudaStream_t s) {
  if (n == 0) return;
  gather_kernel<<<n, 256, 0, s>>>(src, dim, rows, dst);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void moe_dense_combine(const float* y, const int32_t* ids, const float* wts, const float* shared, int T, int k, int H,
                       float* out, cudaStream_t s) {
  if (T == 0) return;
  combine_kernel<<<T, 256, 0, s>>>(y, ids, wts, shared, T, k, H, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}
void argmax_rows(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  argmax_kernel<<<rows, 1024, 0, s>>>(logits, vocab, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::engine::gpu
