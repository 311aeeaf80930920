// The kernels behind argmax_f32.hpp. Kernels only: argmax_f32.cu launches them,
// tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
//
// argmax_split_kernel: grid (slices, rows), kArgmaxThreads threads. Each value becomes a 64-bit
// key, (order-preserving bits of the value) << 32 | (0xffffffff − id), so that the larger key
// is the larger value and, between equal values, the lower id; NaN gets key 0 (below every
// number, -inf included) and never wins; -0 counts as +0 (they tie, the lower id wins, as `>`
// says). The max of keys is exact, so any order of reduction gives the same answer.
// A CTA scans its slice of the row with 16-byte loads, kArgmaxUnroll per thread in flight at
// once, then reduces in the block. One slice per row: it writes out[row]. Several: it writes its
// key to the workspace, and the grid's last CTA to finish (a counter) merges every row's keys,
// writes out and zeros the keys and the counter, so the workspace is all zeros again after
// every launch (graph replay included).
// argmax_kernel_v0: the previous form (one CTA of 1,024 threads per row, a strided scalar scan),
// for `fp4moe bench rows` only.
#pragma once

#include "cuda/common/device_prims.cuh"

namespace fp4moe::cuda::sampling::argmax {

inline constexpr int kArgmaxThreads = 256;
inline constexpr int kArgmaxUnroll = 4;                                         // 16-byte loads per thread in flight
inline constexpr int kArgmaxSliceMin = kArgmaxThreads * kArgmaxUnroll * 4;   // 4,096 values: one pass of a CTA
inline constexpr int kArgmaxTargetCtas = 512;  // about 4 CTAs per SM of an H100 / H200 (132 SMs)
inline constexpr int kArgmaxSplitRowsMax = 128;  // rows from here on: one CTA per row
inline constexpr int kArgmaxV0Threads = 1024;

// CTAs per row: enough to put ~kArgmaxTargetCtas CTAs on the GPU, none with less than one pass.
inline int argmax_slices(int rows, int vocab) {
  if (rows >= kArgmaxSplitRowsMax || rows <= 0) return 1;
  const int by_vocab = (vocab + kArgmaxSliceMin - 1) / kArgmaxSliceMin;
  const int by_gpu = (kArgmaxTargetCtas + rows - 1) / rows;
  const int s = by_vocab < by_gpu ? by_vocab : by_gpu;
  return s < 1 ? 1 : s;
}
// Workspace bytes of a launch (0 with one slice per row): the counter (16 bytes), then one key
// per (row, slice). Never more than argmax_workspace_bytes_max().
inline size_t argmax_workspace_bytes_for(int rows, int vocab) {
  const int s = argmax_slices(rows, vocab);
  return s == 1 ? 0 : 16 + size_t(rows) * size_t(s) * 8;
}
// rows · ceil(target / rows) < target + rows, rows < kArgmaxSplitRowsMax.
inline constexpr size_t argmax_workspace_bytes_max() {
  return 16 + size_t(kArgmaxTargetCtas + kArgmaxSplitRowsMax) * 8;
}

namespace {

__device__ __forceinline__ unsigned long long argmax_key(float x, int id) {
  if (isnan(x)) return 0ull;
  const unsigned u = x == 0.0f ? 0u : __float_as_uint(x);
  const unsigned ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(ord) << 32) | static_cast<unsigned long long>(0xffffffffu - unsigned(id));
}
__device__ __forceinline__ unsigned long long key_max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
__device__ __forceinline__ int key_id(unsigned long long k) { return k == 0ull ? 0 : int(0xffffffffu - unsigned(k & 0xffffffffull)); }

__device__ __forceinline__ unsigned long long warp_key_max(unsigned long long k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) k = key_max(k, __shfl_xor_sync(prims::kFullMask, k, o));
  return k;
}

// The block's max key (every thread calls; thread 0 gets it).
__device__ __forceinline__ unsigned long long block_key_max(unsigned long long k) {
  __shared__ unsigned long long part[kArgmaxThreads / 32];
  k = warp_key_max(k);
  if (prims::lane_id() == 0) part[prims::warp_id()] = k;
  __syncthreads();
  if (prims::warp_id() == 0) {
    k = prims::lane_id() < kArgmaxThreads / 32 ? part[prims::lane_id()] : 0ull;
    k = warp_key_max(k);
  }
  return k;
}

// logits [rows, V] contiguous; ws: argmax_workspace_bytes_for(rows, V) bytes, zeros (nullptr
// with one slice per row).
__global__ void __launch_bounds__(kArgmaxThreads) argmax_split_kernel(const float* logits, int V, int32_t* out, void* ws) {
  const int row = int(blockIdx.y), slice = int(blockIdx.x), slices = int(gridDim.x), t = int(threadIdx.x);
  const float* r = logits + int64_t(row) * V;
  // The row's 16-byte-aligned body [head, head + 4 · nvec); the head (< 4 values) and the tail
  // (< 4) go to slice 0 as scalars.
  const int head = int(((16u - unsigned(reinterpret_cast<uintptr_t>(r) & 15u)) & 15u) / 4u);
  const int h = head < V ? head : V;
  const int nvec = (V - h) / 4, tail0 = h + 4 * nvec;
  // This slice's vectors: [v0, v1), whole passes of kArgmaxThreads · kArgmaxUnroll.
  constexpr int kPass = kArgmaxThreads * kArgmaxUnroll;
  const int passes = (nvec + kPass - 1) / kPass, per = (passes + slices - 1) / slices;
  const int v0 = slice * per * kPass, v1e = (slice + 1) * per * kPass, v1 = v1e < nvec ? v1e : nvec;
  const float4* body = reinterpret_cast<const float4*>(r + h);
  unsigned long long best = 0ull;
  for (int base = v0; base < v1; base += kPass) {
    float4 f[kArgmaxUnroll];
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u) {
      const int v = base + u * kArgmaxThreads + t;
      f[u] = v < v1 ? body[v] : float4{NAN, NAN, NAN, NAN};
    }
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u) {
      const int id = h + 4 * (base + u * kArgmaxThreads + t);
      best = key_max(best, argmax_key(f[u].x, id));
      best = key_max(best, argmax_key(f[u].y, id + 1));
      best = key_max(best, argmax_key(f[u].z, id + 2));
      best = key_max(best, argmax_key(f[u].w, id + 3));
    }
  }
  if (slice == 0) {
    if (t < h) best = key_max(best, argmax_key(r[t], t));
    if (tail0 + t < V) best = key_max(best, argmax_key(r[tail0 + t], tail0 + t));
  }
  best = block_key_max(best);
  if (slices == 1) {
    if (t == 0) out[row] = key_id(best);
    return;
  }
  unsigned* counter = static_cast<unsigned*>(ws);
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(static_cast<unsigned char*>(ws) + 16);
  __shared__ bool last;
  if (t == 0) {
    __stcg(&keys[int64_t(row) * slices + slice], best);
    __threadfence();  // the key is visible before the count says so
    const unsigned total = gridDim.x * gridDim.y;
    last = atomicAdd(counter, 1u) == total - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The last CTA: every key into shared memory at once (rows · slices < kArgmaxTargetCtas +
  // kArgmaxSplitRowsMax, argmax_slices' bound: at most 3 loads per thread, all in flight), zeroed
  // behind, then one warp per row over its keys there.
  __shared__ unsigned long long merged[kArgmaxTargetCtas + kArgmaxSplitRowsMax];
  const int rows = int(gridDim.y), n = rows * slices;
  for (int i = t; i < n; i += kArgmaxThreads) merged[i] = __ldcg(&keys[i]);
  for (int i = t; i < n; i += kArgmaxThreads) __stcg(&keys[i], 0ull);  // all zeros again after the launch
  __syncthreads();
  for (int rr = prims::warp_id(); rr < rows; rr += kArgmaxThreads / 32) {
    unsigned long long k = 0ull;
    for (int s = prims::lane_id(); s < slices; s += 32) k = key_max(k, merged[rr * slices + s]);
    k = warp_key_max(k);
    if (prims::lane_id() == 0) out[rr] = key_id(k);
  }
  if (t == 0) *counter = 0u;  // zeros again for the next launch (and graph replay)
}

__global__ void argmax_kernel_v0(const float* logits, int V, int32_t* out) {
  const float* row = logits + int64_t(blockIdx.x) * V;
  float best = -INFINITY;
  int bi = -1;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = row[v];
    if (!isnan(x) && (bi < 0 || x > best)) best = x, bi = v;  // v increases: ties keep the lower id
  }
  __shared__ float sb[kArgmaxV0Threads];
  __shared__ int si[kArgmaxV0Threads];
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

}  // namespace
}  // namespace fp4moe::cuda::sampling::argmax
