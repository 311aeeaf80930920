// Grouped FP4 GEMM for MoE experts (host API; no CUDA types leak except cudaStream_t).
//
//   y[m, n] = sum_k x[m, k] * W_e[n, k] * global_e     for rows m of expert e
//
// x is [M_total, K] BF16, rows already permuted so expert e owns rows
// [expert_offsets[e], expert_offsets[e+1]) (offsets live on the DEVICE, E+1 ints, so
// no host synchronisation is needed). W is NVFP4 (or MXFP4) [E, N, K/2] + scales
// [E, N, K/block] + FP32 globals [E]: re-laid for the sm90 kernels (upload_weights,
// DeviceExpertWeights), or in the checkpoint layout for Generic / DequantCublas
// (LinearFp4Weights). y is [M_total, N] BF16 (or [M_total, N/2] with SiluMul).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/device_buffer.hpp"
#include "cuda/moe_gemm/moe_gemm_types.hpp"
#include "cuda/moe_gemm/weight_relayout.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

std::ostream& operator<<(std::ostream&, const MoeGemmDesc&);

// Device pointers for one call.
struct MoeGemmArgs {
  const void* x = nullptr;               // [M_total, K] bf16 (W4A4 emulation quantizes it on the fly)
  const int32_t* expert_offsets = nullptr;  // [E+1] device
  const float* row_scale = nullptr;      // [M_total] for Epilogue::RowScale
  void* y = nullptr;                     // [M_total, N or N/2] bf16
  int m_total = 0;                       // rows of x actually valid (<= desc.max_tokens) —
                                         // may be an upper bound; offsets decide
  void* workspace = nullptr;             // workspace_bytes(desc, cfg) bytes, or null if 0
  cudaStream_t stream = nullptr;
  // W4A4 emulation (ActFormat::NVFP4_EMULATED) only: device FP32 scalar, the activations'
  // per-tensor global scale (ModelOpt input_scale = amax / (6 * 448)). Null: computed on
  // the device from amax(x) of rows [0, m_total) into the workspace (no host sync).
  const float* act_global_scale = nullptr;
  // Only experts [expert_begin, expert_end) (expert_end < 0: to num_experts): e.g. the routed
  // experts with one config and a folded shared expert with another. Offsets stay absolute.
  int expert_begin = 0, expert_end = -1;
  // Measurements only (the split-K sweep, tests): force the sm90 split-K factor where the
  // workspace allows splitting; 0: the kernel picks it from the tile count.
  int force_splits = 0;
};

// ---- Sm90Wgmma / Sm90Decode: the sm_90a kernel family (sm90_nvfp4_grouped_gemm.cuh) ----

// Owning device copy of an FP4 ExpertStack in the sm90 kernel's re-laid layout
// (weight_layout.cpp; see sm90_tile_layout.hpp for the byte layout). The layout depends on
// the epilogue: SiluMul interleaves gate and up rows inside each 128-row tile, so weights
// uploaded for SiluMul can only run SiluMul, and the others only None / RowScale.
class DeviceExpertWeights {
 public:
  // Device storage for E experts of [n, k] in this layout, contents not set (upload_weights
  // fills it; benchmarks may copy chunks in themselves). global_scale_host is all 1.
  static DeviceExpertWeights allocate(WeightFormat format, bool silu_layout, int num_experts, int n, int k);

  WeightFormat format = WeightFormat::NVFP4;
  bool silu_layout = false;           // uploaded for Epilogue::SiluMul
  int num_experts = 0, n = 0, k = 0;
  uint8_t* tiles = nullptr;           // [E, N/128, K/64, 4608 B] device (sm90_tile_layout.hpp)
  float* global_scale = nullptr;      // [E] device (1 for MXFP4)
  std::vector<float> global_scale_host;  // [E]
  size_t bytes() const;               // device bytes of tiles + globals

 private:
  DeviceBuffer storage_;              // tiles, then the globals: `tiles` and `global_scale` point into it
};

class StagedUpload;

// Re-lays and uploads (synchronous: returns when the weights are on the device). Checks: FP4
// format, N % 128 == 0, K % 64 == 0, finite non-negative scales; MXFP4 scales in [2^-118, 2^8].
// Stacks may be owned or view mode (the mmap'd checkpoint; gate/up globals unified as
// Checkpoint::load_moe_layer does, format/moe_layer.hpp's Fp4ExpertRows): the re-layout runs
// per 128-row tile straight into the pinned staging of `staging` (its threads, its copies
// overlapped; null: a temporary one), so no host copy of the stack is made.
DeviceExpertWeights upload_weights(const ExpertStack& w, Epilogue epilogue, cudaStream_t stream = nullptr);
// Several FP4 stacks of one format and one [N, K] uploaded as ONE weight set whose experts
// are the stacks' experts in order (e.g. the routed experts, then the shared expert's pieces:
// moe/shared_fold.hpp); per-expert global scales stay per expert. Same checks as
// upload_weights, plus: same format, N and K in every stack.
DeviceExpertWeights upload_weights_concat(const std::vector<const ExpertStack*>& stacks, Epilogue epilogue,
                                          cudaStream_t stream = nullptr, StagedUpload* staging = nullptr);
// (The host re-layout alone: relayout_weights_sm90, weight_relayout.hpp.)

// Empty string when `cfg` can run `desc` on a GPU of compute capability `sm` (e.g. 90),
// else the reason in one line (shapes, shared memory bytes, arch).
std::string can_implement(const MoeGemmDesc& desc, const TileConfig& cfg, int sm);

// Every Sm90Wgmma / Sm90Decode config the tuner may pick for `desc` (all are tested).
std::vector<TileConfig> candidate_configs(const MoeGemmDesc& desc);

// A reasonable config without tuning, from the average tokens per hit expert.
TileConfig default_config(const MoeGemmDesc& desc, double tokens_per_expert);

// Device workspace `run_moe_gemm` needs: W4A4 (the fake-quantized activations + scalar), then
// the split-K state of block_n <= 128 (16 MiB of FP32 partials + counters; with a null
// workspace the kernel does not split). 256-byte aligned.
size_t workspace_bytes(const MoeGemmDesc& desc, const TileConfig& cfg);

// Runs y = epilogue(x * W^T) on args.stream. No host synchronisation; graph-capturable.
// `w` must come from upload_weights with a layout matching desc.epilogue. Throws fp4moe::Error when can_implement fails or pointers are
// misaligned (x, y 16-byte; K * 2 bytes row stride 16-byte aligned). Host work per call:
// the checks (no string is built unless one fails), the activations' tensor map (a 128-byte
// descriptor encoded on the host) and the launch; no allocation, no file or environment access.
void run_moe_gemm(const MoeGemmDesc& desc, const TileConfig& cfg, const DeviceExpertWeights& w,
                  const MoeGemmArgs& args);

// W4A4 emulation pre-pass (act_quant.cu): x_fq[m, k] = e2m1(m, k) * e4m3_scale(m, k / 16)
// in BF16 (exact), quantized with global scale *act_global (device scalar) as Blackwell
// NVFP4 activations are; the global itself is NOT applied (the GEMM epilogue applies it).
void fake_quantize_activations_nvfp4(const void* x, void* x_fq, int64_t rows, int64_t k,
                                     const float* act_global, cudaStream_t stream);
// act_global_out[0] = amax(x[0:rows, :]) / (6 * 448) (1 when x is all zero).
void compute_act_global_scale(const void* x, int64_t rows, int64_t k, float* act_global_out,
                              cudaStream_t stream);

}  // namespace fp4moe::cuda
