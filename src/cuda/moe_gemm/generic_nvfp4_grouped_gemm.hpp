// GemmKernel::Generic: the fallback grouped FP4 GEMM that accepts any shape on any arch
// (sm_80+; mma.sync m16n8k16 BF16, FP32 accumulate), the tuner's "tactic -1".
//
// It reads the weights in the LINEAR checkpoint layout (no re-layout): packed
// [E, N, K/2] (element 2j in the low nibble of byte j), scales [E, N, K/block]
// (E4M3 for NVFP4, E8M0 for MXFP4), FP32 globals [E]. Decodes E2M1 x scale to BF16
// (exact) in shared memory, FP32 accumulate, applies the global scale and the epilogue
// (None / SiluMul with gate rows [0, N/2) and up rows [N/2, N) / RowScale) in FP32 and
// writes BF16. Offsets are read on the device: no host synchronisation, graph-capturable.
//
// Requirements (checked, clear fp4moe::Error otherwise): K a multiple of the block size
// (16 NVFP4, 32 MXFP4), N even for SiluMul, x 16-byte aligned, packed 8-byte aligned,
// BF16 activations (ActFormat::BF16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/device_buffer.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

// Device view of FP4 expert weights in the linear checkpoint layout (as ExpertStack holds them).
struct LinearFp4Weights {
  WeightFormat format = WeightFormat::NVFP4;   // NVFP4 or MXFP4
  int num_experts = 0, n = 0, k = 0;
  const uint8_t* packed = nullptr;             // [E, N, K/2]      device
  const uint8_t* scales = nullptr;             // [E, N, K/block]  device
  const float* global_scale = nullptr;         // [E] device; null means 1 (MXFP4)
  const float* global_scale_host = nullptr;    // [E] host copy (optional; cuBLAS grouped path)
  int block() const { return format == WeightFormat::MXFP4 ? 32 : 16; }
};

// Owning device copy of an FP4 ExpertStack, linear layout. Upload is synchronous.
class DeviceLinearFp4Weights {
 public:
  DeviceLinearFp4Weights() = default;
  explicit DeviceLinearFp4Weights(const ExpertStack& stack);
  // Several stacks (same format, N, K) as one set: their experts in order (no host concat).
  explicit DeviceLinearFp4Weights(const std::vector<const ExpertStack*>& stacks);
  DeviceLinearFp4Weights(DeviceLinearFp4Weights&& o) noexcept;
  DeviceLinearFp4Weights& operator=(DeviceLinearFp4Weights&& o) noexcept;
  DeviceLinearFp4Weights(const DeviceLinearFp4Weights&) = delete;
  DeviceLinearFp4Weights& operator=(const DeviceLinearFp4Weights&) = delete;

  const LinearFp4Weights& view() const { return view_; }
  size_t device_bytes() const { return buffer_.bytes(); }

 private:
  LinearFp4Weights view_;
  DeviceBuffer buffer_;  // one allocation: packed | scales | globals
  std::vector<float> host_globals_;
};

// The single config the generic kernel has (for logs and the tuner).
TileConfig generic_tile_config();

// "" when the linear-layout weights w are what desc asks for (format, E, N, K), else the
// mismatch in one line. Shared by the Generic and DequantCublas checks.
std::string linear_weights_mismatch(const MoeGemmDesc& desc, const LinearFp4Weights& w);

// Host-side check: "" when the generic kernel can compute desc with these weights, else the
// reason in one line. Needs no GPU.
std::string generic_can_implement(const MoeGemmDesc& desc, const LinearFp4Weights& w);

// y = x . W_e^T * global_e (+ epilogue) for every expert. args.workspace is unused (the
// weights come in `w`; no workspace). Throws fp4moe::Error on an
// unsupported desc or bad pointers (before launching anything).
void run_generic_grouped_gemm(const MoeGemmDesc& desc, const LinearFp4Weights& w,
                              const MoeGemmArgs& args);

}  // namespace fp4moe::cuda
