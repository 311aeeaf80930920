// FlashInfer's portable MLA kernel (attention/mla.cuh) for sm_100a and sm_120a, BF16 Q / KV / O,
// ckv 512, kpe 64, causal: one instantiation (its launcher dispatches three tile configs by
// the SM's shared memory). Plus the shared-memory facts of both KV dtypes from the kernel's own
// types (sm1xx_mla_fa2.hpp). Compiled, not run.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <flashinfer/attention/mla.cuh>

#include "cuda/attention/sm1xx_mla_fa2.hpp"
#include "cuda/attention/sm1xx_mla_flashinfer_fa2.cuh"

namespace fp4moe::cuda::attention {
namespace flashinfer_glue {

cudaError_t run_mla_fa2_bf16(const MlaParamsBf16& p, uint32_t blocks_x, uint32_t blocks_y, cudaStream_t stream) {
  return ::flashinfer::mla::BatchMLAPagedAttention<::flashinfer::MaskMode::kCausal, 512, 64>(p, blocks_x, blocks_y,
                                                                                              stream);
}

}  // namespace flashinfer_glue

namespace {

template <uint32_t kStages, bool kShard, uint32_t kTileKv, typename DTypeKV>
int64_t storage_bytes() {
  using Traits = ::flashinfer::mla::KernelTraits<true, kStages, kShard, 512, 64, 64, kTileKv, __nv_bfloat16, DTypeKV,
                                                 __nv_bfloat16, int32_t>;
  return int64_t(sizeof(typename Traits::SharedStorage));
}

}  // namespace

// The configs of mla.cuh's DISPATCH_SMEM_CONFIG for 233,472 B (sm_100) and 102,400 B (sm_120)
// per SM, and its FP8 override (32 keys, no QK sharding).
MlaFa2SmemTable mla_fa2_smem() {
  MlaFa2SmemTable t;
  t.rows[0] = {233472, 2, 64, storage_bytes<2, true, 64, __nv_bfloat16>(), 32, storage_bytes<2, false, 32, __nv_fp8_e4m3>()};
  t.rows[1] = {102400, 1, 16, storage_bytes<1, false, 16, __nv_bfloat16>(), 32, storage_bytes<1, false, 32, __nv_fp8_e4m3>()};
  t.count = 2;
  return t;
}

}  // namespace fp4moe::cuda::attention
