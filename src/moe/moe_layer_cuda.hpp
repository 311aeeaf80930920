// The MoE layer on the GPU: a stateless op over a caller-owned workspace.
//
//   x [T, H] bf16 ─┬─ router: logits = x·W_gateᵀ (FP32 FMAs, cuda/routing), scoring, grouped
//                  │          top-k, top-k, weights                    → ids, weights [T, k]
//                  │  permute: counts/offsets [E+n_sh+1] (device), stable ranks, row
//                  │           maps, gather x rows in expert order    → x_perm [T·R, H]
//                  │  GEMM1: grouped gate_up, Epilogue::SiluMul       → h [T·R, I]
//                  │  GEMM2: grouped down, Epilogue::RowScale (routing weight)
//                  │                                                  → y [T·R, H]
//                  └─ (fallback only) shared expert as its own E = 1 grouped GEMMs
//                     (gate_up+SiluMul, down) on the same stream      → ys [T, H] bf16
//                     or, BF16 shared expert (NVIDIA's NVFP4 checkpoints): a dense MLP on
//                     cuBLASLt (moe/shared_bf16.hpp)                  → ys [T, H] f32
//   combine: out[t] = Σ_slots y[row(t, slot)] (+ ys[t])   (FP32 sum, slot order)
//
// Folded shared expert (the default when it is compatible: same FP4 format as the routed
// experts and shared_inter = n_sh · inter, moe/shared_fold.hpp): its n_sh pieces are experts
// E..E+n_sh-1 of the SAME grouped GEMMs, selected by every token with weight 1 (no routed
// scaling), so R = k + n_sh rows per token and the combine sums them in the order: routed
// slots in rank order, then shared pieces 0..n_sh-1. Otherwise (or with
// MoeCudaOptions::fold_shared = false) R = k and the shared expert runs separately as above.
// A BF16 shared expert is never folded (the routed experts are FP4).
//
// The layer object holds only its weights and what was decided at construction (the GEMM
// path and every tokens bucket's tile config); it owns no stream, event, workspace or graph.
// forward() enqueues on the caller's stream, into the caller's workspace: no host
// synchronisation, no allocation, no string formatting, no file or environment access. So
// one workspace serves every layer (one forward at a time: layers run in sequence on one
// stream), and forward() can be captured in a CUDA graph (moe_runner.hpp does, per bucket).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cpu/moe_cpu.hpp"
#include "format/moe_layer.hpp"
#include "moe/expert_gemm.hpp"

namespace fp4moe {

enum class MoeStage : int { Router, Permute, Gemm1, Gemm2, Shared, Combine };
inline constexpr int kNumMoeStages = 6;
const char* moe_stage_name(MoeStage s);  // "router", "permute", "gemm1", "gemm2", "shared", "combine"

struct MoeCudaOptions {
  int max_tokens = 0;               // the largest T a forward will get: tile configs are chosen per
                                    // tokens bucket up to it (and workspace_bytes(max_tokens) fits any T)
  MoeGemmPath gemm = MoeGemmPath::Auto;  // grouped GEMM path: Auto by the GPU's arch (env FP4MOE_MOE_GEMM overrides)
  bool w4a4 = false;                // NVFP4 activation emulation on the sm90 path (the sm1xx path is always W4A4)
  bool fold_shared = true;          // fold a compatible shared expert into the routed GEMMs
  // Pinned staging the weight upload streams through (its threads re-lay the experts; the
  // loader's, shared by every layer); null: a temporary one per upload.
  cuda::StagedUpload* staging = nullptr;
};

// Caller-owned device scratch of a forward: 256-byte aligned, at least workspace_bytes(T)
// bytes, and ZEROED ONCE after allocation (the router keeps counters at its start and leaves
// them at zero). Its contents are only meaningful between a forward and the next use.
struct MoeWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Device views of one forward's routing, inside the workspace it ran in (valid until the
// workspace is used again): logits [T, E] f32, ids / weights [T, k], offsets [E+n_sh+1] (with
// a folded shared expert entries E.. are the shared pieces, T rows each).
struct MoeRoutingView {
  const float* logits = nullptr;
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  const int32_t* expert_offsets = nullptr;
};

// Per-stage timing of a forward (optional): the forward records begin[s] / end[s] on the
// stream around every stage it runs and sets ran[s]. The events belong to the caller.
struct MoeStageEvents {
  std::array<cudaEvent_t, kNumMoeStages> begin{}, end{};
  std::array<bool, kNumMoeStages> ran{};
};

class MoeLayerCuda {
 public:
  // Uploads the weights and resolves the configs (synchronous; throws fp4moe::Error on a bad
  // layer or config).
  MoeLayerCuda(const MoeLayerWeights& w, const MoeCudaOptions& opt);
  // A layer of this config with random NVFP4 weights (moe/random_layer.hpp; the host
  // copy is dropped after the upload) — for benchmarks at full size.
  static std::unique_ptr<MoeLayerCuda> random(const MoeConfig& cfg, const MoeCudaOptions& opt, uint64_t seed);
  ~MoeLayerCuda();
  MoeLayerCuda(const MoeLayerCuda&) = delete;
  MoeLayerCuda& operator=(const MoeLayerCuda&) = delete;

  const MoeConfig& config() const;
  int max_tokens() const;
  std::string describe() const;                    // config and the GEMM path of each stack, one line
  std::string gemm_configs(int64_t tokens) const;  // the GEMM configs a forward of T tokens runs

  // Bytes of workspace a forward of up to `tokens` tokens needs (tokens <= max_tokens()).
  size_t workspace_bytes(int64_t tokens) const;

  // x [T, hidden] bf16 (device, 16-byte aligned), out [T, hidden] f32 or bf16 (device).
  // Enqueue only, on `stream`. Throws before launching anything if T > max_tokens(), a pointer
  // is null or misaligned, or the workspace is smaller than workspace_bytes(T).
  void forward(const uint16_t* x, int64_t tokens, float* out, MoeWorkspace ws, cudaStream_t stream,
               MoeStageEvents* events = nullptr) const;
  void forward(const uint16_t* x, int64_t tokens, uint16_t* out, MoeWorkspace ws, cudaStream_t stream,
               MoeStageEvents* events = nullptr) const;

  // Where a forward of `tokens` tokens in `ws` left its routing.
  MoeRoutingView routing(MoeWorkspace ws, int64_t tokens) const;

  // Bytes one forward must read for its weights: router, shared expert, and each hit
  // expert's gate_up + down (given how many experts were hit).
  size_t router_bytes() const;
  size_t shared_bytes() const;  // the shared expert's weights once (folded: its n_sh pieces; BF16: 2 B each)
  size_t expert_bytes() const;  // one routed expert (gate_up + down)
  // n_sh when the shared expert is folded into the routed GEMMs, else 0 (then it is the
  // separate "shared" stage).
  int64_t shared_folded_pieces() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe
