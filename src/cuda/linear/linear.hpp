// The dense linear op on the GPU: y [T, N] = x [T, K] · Wᵀ for one weight W [N, K] of the
// checkpoint, its kernel chosen ONCE, at load, by the weight's format and shape and the GPU:
//   - NVFP4 / MXFP4 → our FP4 GEMM as the E = 1 case (cuda/moe_gemm/dense_fp4_gemm.hpp): the
//     sm_90a kernels (Fp4Sm90) where N % 128 == 0 and K % 64 == 0 on an sm_90 GPU, else the
//     Generic kernel (Fp4Generic, any N, any arch);
//   - BF16 → cuBLASLt (Bf16Cublaslt: BF16 in, FP32 accumulate, BF16 or FP32 out);
//   - F32, an FP4 weight no FP4 kernel takes, or a caller that needs the BF16 form
//     (LinearDesc::bf16_only) → converted / dequantized to BF16 at load → cuBLASLt; an FP4
//     weight that falls back this way is said in one line per shape at load.
//   - FP8: no checkpoint format this engine reads has FP8 linears (format/checkpoint.hpp's
//     TensorGroupFormat, cpu::LinearFormat), so there is no FP8 kernel; Checkpoint::find_linear
//     refuses an FP8 weight at load ("... has dtype F8_E4M3; expected U8 (FP4), BF16 or F32").
// can_implement(kernel, desc, sm) says why a kernel cannot take a linear (host only, no GPU
// needed); choose_linear_kernel is the whole choice, testable on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cpu/linear_cpu.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/linear/blas.hpp"
#include "cuda/moe_gemm/dense_fp4_gemm.hpp"

namespace fp4moe::cuda {
class StagedUpload;
}

namespace fp4moe::cuda::linear {

enum class LinearKernel : uint8_t { Fp4Sm90, Fp4Generic, Bf16Cublaslt };
const char* linear_kernel_name(LinearKernel k);  // "fp4 sm90" | "fp4 generic" | "bf16 cublaslt"

// What must be computed.
struct LinearDesc {
  cpu::LinearFormat format = cpu::LinearFormat::BF16;
  int64_t n = 0, k = 0;
  int64_t max_tokens = 0;  // rows of the largest call
  // The caller needs the cuBLASLt form whatever the format: FP32 outputs, strided rows, row
  // counts other than the step's (the FP4 kernels read T from the step's device offsets), or
  // the BF16 weight itself (kv_b_proj's per-head products).
  bool bf16_only = false;
};

// "" when `kernel` computes `desc` on a GPU of compute capability `sm` (90: sm_90) in this
// build, else the reason in one line. Bf16Cublaslt takes every format (FP4 / F32 converted to
// BF16 at load).
std::string can_implement(LinearKernel kernel, const LinearDesc& desc, int sm);

struct LinearChoice {
  LinearKernel kernel = LinearKernel::Bf16Cublaslt;
  bool converted = false;  // the weight is converted to BF16 at load (FP4 dequantized, F32 rounded)
  std::string why;         // why the format's own kernel does not run it ("" when it does)
};
// The kernel a linear runs: FP4 → Fp4Sm90, else Fp4Generic, else (or bf16_only) BF16 dequantized;
// BF16 → Bf16Cublaslt; F32 → Bf16Cublaslt converted. Throws fp4moe::Error on a bad shape.
LinearChoice choose_linear_kernel(const LinearDesc& desc, int sm);

// What every linear call of a step shares: the cuBLAS(Lt) handles, the FP4 GEMM's workspace
// (the largest fp4_workspace_bytes() of the linears) and the device offsets {0, T} of the
// step's T tokens (the FP4 kernels read T there).
struct LinearCtx {
  Blas* blas = nullptr;
  const int32_t* offsets = nullptr;
  void* fp4_workspace = nullptr;
  cudaStream_t stream = nullptr;
};

class Linear {
 public:
  Linear() = default;
  // Uploads `w` (a view of the mmap'd checkpoint; the bytes may go when it returns) through
  // `staging` for calls of up to max_tokens rows, on the kernel choose_linear_kernel picks for
  // the current device. `name` (the checkpoint prefix) only labels the fallback's line.
  Linear(const cpu::LinearView& w, const std::string& name, int64_t max_tokens, bool bf16_only, StagedUpload& staging);

  // y [T, n] = x [T, k] · Wᵀ, enqueued on ctx.stream. FP4 kernels: T must be the step's token
  // count (ctx.offsets), x and y dense BF16; Bf16Cublaslt: any T, row strides ldx / ldy (0:
  // dense), y BF16 or FP32 (y_f32).
  void run(const uint16_t* x, int T, void* y, bool y_f32, const LinearCtx& ctx, int64_t ldx = 0, int64_t ldy = 0) const;

  int64_t n = 0, k = 0;
  LinearKernel kernel() const { return choice_.kernel; }
  const LinearChoice& choice() const { return choice_; }
  size_t bytes() const { return bytes_; }  // device bytes of the weight
  size_t fp4_workspace_bytes() const { return fp4_ ? fp4_->workspace_bytes() : 0; }
  // The BF16 weight [n, k] on the device (Bf16Cublaslt only, else null).
  const uint16_t* bf16() const { return static_cast<const uint16_t*>(bf16_.ptr()); }
  std::string describe() const;  // "fp4 sm90 (config per tokens bucket)", "bf16 cublaslt (dequantized at load)", ...

 private:
  LinearChoice choice_;
  size_t bytes_ = 0;
  DeviceBuffer bf16_;
  std::unique_ptr<DenseFp4Gemm> fp4_;
};

// A BF16 [n, k] host copy of any linear view (FP4 rows dequantized, F32 rows rounded).
std::vector<uint16_t> linear_to_bf16(const cpu::LinearView& v);

}  // namespace fp4moe::cuda::linear
