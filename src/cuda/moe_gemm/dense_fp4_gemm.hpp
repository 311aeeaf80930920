// The dense FP4 GEMM: y [T, N] = x [T, K] · Wᵀ · global for ONE NVFP4 / MXFP4 weight [N, K] (a
// model's dense linear), as the E = 1 case of this family's grouped kernels. The explicit dense
// entry point of cuda/moe_gemm (cuda/linear/ calls it; the MoE layer has its own,
// moe/expert_gemm.hpp): no routing, no epilogue, no tuner plan (E = 1 shapes are not tuned:
// each tokens bucket runs cuda::default_config for `tokens` rows on the one expert).
//
// Kernels: Sm90 (the sm_90a wgmma / decode kernels on the re-laid layout: N % 128 == 0,
// K % 64 == 0, an sm_90 GPU and an sm_90a build) and Generic (the linear checkpoint layout, any
// N, K a multiple of the block, any arch). W4A16 both: BF16 activations, FP32 accumulate, BF16
// out. The Blackwell block-scaled kernels (cuda/moe_gemm_sm1xx) are W4A4 expert GEMMs and are
// not offered here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

class StagedUpload;

enum class DenseFp4Kernel : uint8_t { Sm90, Generic };
const char* dense_fp4_kernel_name(DenseFp4Kernel k);  // "sm90" | "generic"

// Host only (no GPU needed): "" when `kernel` computes an [n, k] weight of `format` for up to
// max_tokens rows on a GPU of compute capability `sm` (90: sm_90) in this build, else the
// reason in one line (the kernel family's own can_implement words).
std::string dense_fp4_can_implement(DenseFp4Kernel kernel, WeightFormat format, int64_t n, int64_t k,
                                    int64_t max_tokens, int sm);

class DenseFp4Gemm {
 public:
  DenseFp4Gemm() = default;
  // Uploads `w` (one expert: num_experts == 1; owned, or a view of the mmap'd checkpoint) for
  // `kernel` and calls of up to max_tokens rows. Sm90 re-lays a view per tile into `staging`'s
  // pinned buffers (null: a temporary one); Generic uploads an owned copy. Synchronous. Throws
  // fp4moe::Error (dense_fp4_can_implement's reason) when the kernel cannot take it.
  DenseFp4Gemm(const ExpertStack& w, DenseFp4Kernel kernel, int64_t max_tokens, StagedUpload* staging);

  // y [tokens, N] BF16 = x [tokens, K] BF16 · Wᵀ · global; offsets: device {0, tokens} (the
  // grouped kernels read the row count there, so the call is graph-capturable: `tokens` only
  // picks the bucket's config and must bound the device value). workspace: workspace_bytes().
  // Enqueue only: no allocation, no host sync.
  void run(const void* x, const int32_t* offsets, void* y, int64_t tokens, void* workspace, cudaStream_t stream) const;

  DenseFp4Kernel kernel() const { return kernel_; }
  size_t workspace_bytes() const { return ws_bytes_; }
  size_t weight_bytes() const { return weight_bytes_; }      // bytes one pass over W reads
  std::string describe() const;                              // "sm90 (config per tokens bucket)" / "generic m..n..k.."
  std::string config_for(int64_t tokens) const;              // the config a call of `tokens` runs

 private:
  DenseFp4Kernel kernel_ = DenseFp4Kernel::Generic;
  MoeGemmDesc desc_;
  size_t ws_bytes_ = 0, weight_bytes_ = 0;
  std::vector<TileConfig> plans_;  // Sm90: by tokens bucket (bucket b: tokens in (2^(b-1), 2^b])
  DeviceExpertWeights sm90_;
  DeviceLinearFp4Weights generic_;
};

}  // namespace fp4moe::cuda
