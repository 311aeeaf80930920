// Host API of the Blackwell NVFP4 grouped GEMM for MoE experts (sm_100a / sm_120a, CUTLASS's
// block-scaled MMA). COMPILED, NOT RUN: no Blackwell GPU has executed it.
//
// The contract of moe_gemm.hpp's run_moe_gemm with W4A4 numerics (desc.act NVFP4_EMULATED,
// here native): for the rows m of expert e (device offsets, no host sync)
//   y[m, :] = epilogue( sum_k q(x)[m, k] * W_e[:, k] * input_scale * weight_scale_2[e] )
// where q(x) is x quantized to NVFP4 with the activations' global (args.act_global_scale: the
// checkpoint's static input_scale, or amax / 2688 computed on the device when null).
// One call = quantize x (nvfp4_act_quant.cu) -> CUTLASS grouped GEMM (BF16 D, alpha per
// expert) -> the last pass where the epilogue needs one (SiLU·up from a 2I-wide output, the
// routing weight, the slab-to-rows gather of the MoE decode recipe).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/moe_gemm/moe_gemm.hpp"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"

namespace fp4moe::cuda {

// Which instantiation (sm1xx_bs_kernels.hpp's bs_kernels()).
struct Sm1xxConfig {
  sm1xx::BsRecipe recipe = sm1xx::BsRecipe::Sm120Grouped;
  int tile_m = 0, tile_n = 0, tile_k = 0;
  std::string name() const;  // "sm120-bs 128x64x128"
};

// NVFP4 expert weights in the Blackwell kernels' layout: codes exactly as the checkpoint stores
// them ([E, N, K/2]: CUTLASS's K-major A), scale factors re-laid per expert into 128x4 atoms
// ([E, sf_rows(N), sf_cols(K)], padding zero), weight_scale_2 per expert.
class DeviceBsWeights {
 public:
  DeviceBsWeights() = default;
  ~DeviceBsWeights();
  DeviceBsWeights(DeviceBsWeights&& o) noexcept;
  DeviceBsWeights& operator=(DeviceBsWeights&& o) noexcept;
  DeviceBsWeights(const DeviceBsWeights&) = delete;
  DeviceBsWeights& operator=(const DeviceBsWeights&) = delete;

  int num_experts = 0, n = 0, k = 0;
  uint8_t* codes = nullptr;
  uint8_t* sf = nullptr;
  float* global_scale = nullptr;
  size_t bytes() const;
};

// The host half of the upload: the re-laid scale factors. Checks: NVFP4, K % 128 == 0, N % 8 == 0.
std::vector<uint8_t> swizzle_weight_sf_sm1xx(const ExpertStack& w);
DeviceBsWeights upload_weights_sm1xx(const ExpertStack& w, cudaStream_t stream = nullptr);
// Several stacks of one format, N and K as ONE weight set, experts in order (the MoE layer's
// routed experts, then the folded shared expert's pieces): no host concatenation.
DeviceBsWeights upload_weights_sm1xx(const std::vector<const ExpertStack*>& stacks, cudaStream_t stream = nullptr);

// The instantiations built for sm_<cc> (100 or 120; empty elsewhere or without that arch).
std::vector<Sm1xxConfig> sm1xx_configs(int cc);

// Empty when `cfg` can run `desc` on sm_<cc>, else why: arch, numerics (W4A4 NVFP4 only),
// shape, and CUTLASS's own can_implement on N x max_rows x K. max_rows_per_expert: the slab
// depth of the MoE decode recipe (0: desc.max_tokens; the layer passes its token count).
std::string sm1xx_can_implement(const MoeGemmDesc& desc, const Sm1xxConfig& cfg, int cc, int max_rows_per_expert = 0);

// The per-call workspace, piece by piece (sm1xx_bs_layout.hpp); .total bytes.
sm1xx::BsWorkspaceLayout sm1xx_workspace_layout(const MoeGemmDesc& desc, const Sm1xxConfig& cfg, int sm_count,
                                                int max_rows_per_expert = 0);

// Runs on args.stream; no host synchronisation. args.workspace: sm1xx_workspace_layout(...).total
// bytes for this device's SM count. Throws fp4moe::Error when it cannot run.
void run_moe_gemm_sm1xx(const MoeGemmDesc& desc, const Sm1xxConfig& cfg, const DeviceBsWeights& w,
                        const MoeGemmArgs& args, int max_rows_per_expert = 0);

}  // namespace fp4moe::cuda
