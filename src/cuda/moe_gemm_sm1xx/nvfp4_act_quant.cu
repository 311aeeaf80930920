// NVFP4 activation quantization into the Blackwell kernels' layouts, and the row gather / routing
// weight pass (nvfp4_act_quant.hpp). Plain CUDA, every arch.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm_sm1xx/nvfp4_act_quant.hpp"
#include "cuda/moe_gemm_sm1xx/nvfp4_block_quant.hpp"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_layout.hpp"

namespace fp4moe::cuda::sm1xx {
namespace {

// The expert e in [begin, end) with off[e] <= r < off[e + 1], or -1.
__device__ __forceinline__ int expert_of_row(const int32_t* __restrict__ off, int begin, int end, int64_t r) {
  if (r < off[begin] || r >= off[end]) return -1;
  int lo = begin, hi = end;  // off[lo] <= r < off[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (off[mid] <= r) lo = mid; else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// One thread per 16-element block of one row.
__global__ void quantize_act_kernel(ActQuantArgs a) {
  const int kb_per_row = a.k / kSfVec;
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= a.rows * kb_per_row) return;
  const int64_t r = b / kb_per_row;
  const int kb = int(b % kb_per_row);
  const int e = expert_of_row(a.offsets, a.expert_begin, a.expert_end, r);
  if (e < 0) return;
  const int64_t local = r - a.offsets[e];

  float v[16];
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(a.x);
  if (a.silu_mul) {
    const __nv_bfloat16* gate = x + r * 2 * int64_t(a.k) + kb * kSfVec;
    const __nv_bfloat16* up = gate + a.k;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      v[i] = __bfloat162float(__float2bfloat16_rn(silu(__bfloat162float(gate[i])) * __bfloat162float(up[i])));
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(x + r * int64_t(a.k) + kb * kSfVec);
    const uint4 raw[2] = {src[0], src[1]};
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(raw);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = __bfloat162float(h[i]);
  }

  const Nvfp4Block q = quantize_block16(v, *a.global);

  int64_t out_row, sf_row;
  if (a.max_n > 0) {
    out_row = slab_row(e - a.expert_begin, local, a.max_n);
    sf_row = slab_sf_row(e - a.expert_begin, local, a.max_n);
  } else {
    out_row = r;
    sf_row = act_sf_row_base(e, a.offsets[e]) + local;
  }
  *reinterpret_cast<uint2*>(a.out_fp4 + out_row * (a.k / 2) + kb * 8) = make_uint2(q.lo, q.hi);
  a.out_sf[sf_offset(sf_row, kb, a.k)] = q.sf;
}

// One thread per 8 BF16 of one output row.
__global__ void gather_scale_rows_kernel(RowGatherArgs a) {
  const int chunks = a.n / 8;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.rows * chunks) return;
  const int64_t r = t / chunks;
  const int c = int(t % chunks);
  const int e = expert_of_row(a.offsets, a.expert_begin, a.expert_end, r);
  if (e < 0) return;
  const int64_t src_row = a.max_n > 0 ? slab_row(e - a.expert_begin, r - a.offsets[e], a.max_n) : r;
  const int src_cols = a.silu_mul ? 2 * a.n : a.n;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(a.src) + src_row * src_cols + c * 8;
  uint4 v = *reinterpret_cast<const uint4*>(src);
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&v);
  if (a.silu_mul) {
    const uint4 up = *reinterpret_cast<const uint4*>(src + a.n);
    const __nv_bfloat162* u = reinterpret_cast<const __nv_bfloat162*>(&up);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 g = __bfloat1622float2(p[i]), x = __bfloat1622float2(u[i]);
      p[i] = __floats2bfloat162_rn(silu(g.x) * x.x, silu(g.y) * x.y);
    }
  }
  if (a.row_scale) {
    const float w = a.row_scale[r];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(p[i]);
      p[i] = __floats2bfloat162_rn(f.x * w, f.y * w);
    }
  }
  *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.y) + r * a.n + c * 8) = v;
}

}  // namespace

void quantize_act_nvfp4(const ActQuantArgs& a, cudaStream_t stream) {
  const int64_t blocks = a.rows * (a.k / kSfVec);
  if (blocks == 0 || a.expert_end <= a.expert_begin) return;
  quantize_act_kernel<<<unsigned((blocks + 255) / 256), 256, 0, stream>>>(a);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void gather_scale_rows_bf16(const RowGatherArgs& a, cudaStream_t stream) {
  const int64_t threads = a.rows * (a.n / 8);
  if (threads == 0 || a.expert_end <= a.expert_begin) return;
  gather_scale_rows_kernel<<<unsigned((threads + 255) / 256), 256, 0, stream>>>(a);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::sm1xx
