// GemmKernel::DequantCublas: the baseline path and the same-run comparison.
//
// Per call: the experts that have tokens are dequantized to BF16 (exact: E2M1 x scale) into
// a workspace of `slots` experts, then one cuBLASLt matmul per expert (BF16 in, FP32
// accumulate, BF16 out; the FP32 global scale is cuBLAS's alpha, read on the device), then
// the epilogue as a small extra kernel: SiluMul from a BF16 [M, N] intermediate,
// RowScale in place on y. More hit experts than slots: dequantize + GEMM in chunks
// (stream order makes the reuse safe).
//
// HOST SYNCHRONISATION: cuBLAS needs each expert's M on the host. `run` takes a host copy
// of the offsets (the benchmark and tests have one); without it, it copies the device
// offsets to the host and synchronises the stream, so the MoE layer can use this path only
// with a host sync (and not inside graph capture). With host offsets and
// Mode::CublasLt it is graph-capturable.
//
// Modes: CublasLt (one cublasLtMatmul per hit expert, heuristic cached per M) or
// GroupedBatched (one cublasGemmGroupedBatchedEx call per chunk; needs the host copy of the
// globals, w.global_scale_host, for its alpha array).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <cuda_runtime_api.h>

#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"

namespace fp4moe::cuda {

struct DequantCublasOptions {
  enum class Mode : uint8_t { CublasLt, GroupedBatched };
  Mode mode = Mode::CublasLt;
  size_t max_dequant_bytes = size_t(4) << 30;  // BF16 expert slots: at most this many bytes
};

const char* dequant_cublas_mode_name(DequantCublasOptions::Mode m);  // "cublaslt" | "grouped"

// Host-side check: "" when the baseline can compute desc with these weights, else why.
std::string dequant_cublas_can_implement(const MoeGemmDesc& desc, const LinearFp4Weights& w);

class DequantCublasGemm {
 public:
  // Allocates everything (BF16 slots, the SiluMul intermediate for desc.max_tokens rows,
  // cuBLASLt workspace, handles). Throws fp4moe::Error if desc is unsupported.
  explicit DequantCublasGemm(const MoeGemmDesc& desc, DequantCublasOptions opt = {});
  ~DequantCublasGemm();
  DequantCublasGemm(const DequantCublasGemm&) = delete;
  DequantCublasGemm& operator=(const DequantCublasGemm&) = delete;

  const MoeGemmDesc& desc() const { return desc_; }
  int slots() const;               // experts dequantized per chunk
  size_t device_bytes() const;     // everything this object allocated
  TileConfig tile_config() const;  // {DequantCublas, block_m = slots, ...} for logs

  // y = epilogue(x . W_e^T * global_e). host_offsets: [E+1] host copy of
  // args.expert_offsets, or empty (then: D2H copy + stream synchronisation).
  // args.workspace is unused (weights in `w`, workspace owned here).
  void run(const LinearFp4Weights& w, const MoeGemmArgs& args,
           std::span<const int32_t> host_offsets = {});

 private:
  struct Impl;
  MoeGemmDesc desc_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::cuda
