// The MoE layer on the GPU, end to end:
//
//   x [T, H] bf16 ─┬─ router: bf16→f32, logits = x·W_gateᵀ (FP32 SGEMM), fused score +
//                  │          grouped top-k + top-k + weights        → ids, weights [T, k]
//                  │  permute: counts/offsets [E+n_sh+1] (device), stable ranks, row
//                  │           maps, gather x rows in expert order    → x_perm [T·R, H]
//                  │  GEMM1: grouped gate_up, Epilogue::SiluMul       → h [T·R, I]
//                  │  GEMM2: grouped down, Epilogue::RowScale (routing weight)
//                  │                                                  → y [T·R, H]
//                  └─ (fallback only) shared expert on a second stream (event fork/join):
//                     the same grouped GEMM with E = 1: gate_up+SiluMul, down → ys [T, H]
//   combine: out[t] = Σ_slots y[row(t, slot)] (+ ys[t])   (FP32 sum, slot order)
//
// Folded shared expert (the default when it is compatible: same FP4 format as the routed
// experts and shared_inter = n_sh · inter, moe/shared_fold.hpp): its n_sh pieces are experts
// E..E+n_sh-1 of the SAME grouped GEMMs, selected by every token with weight 1 (no routed
// scaling), so R = k + n_sh rows per token and the combine sums them in the order: routed
// slots in rank order, then shared pieces 0..n_sh-1. Otherwise (or with
// MoeCudaOptions::fold_shared = false) R = k and the shared expert runs separately as above.
//
// No host synchronisation inside forward(): the per-expert counts stay on the device
// and the GEMMs read the offsets there; every workspace is allocated once at
// construction, sized from max_tokens. So forward() can be captured in a CUDA graph.
//
// How a server uses it (graphs): a graph bakes its launch shapes (grid sizes, the
// cuBLAS router GEMM's T), so capture_graph(T) records one graph per token BUCKET
// (e.g. 1, 2, 4, ..., max_tokens) on the layer's own input/output buffers. For a batch
// of T tokens, write them into graph_input() rows [0, T), replay_graph(T) runs the
// smallest captured bucket >= T, and rows [0, T) of graph_output() are the result. MoE
// rows are independent (nothing mixes tokens), so the padding rows [T, bucket) change
// nothing for the real rows; they only cost their share of work — hence buckets.
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
  int max_tokens = 0;               // workspace sizing: forward() accepts T <= max_tokens
  bool shared_side_stream = true;   // overlap the shared expert on a second stream
  MoeGemmPath gemm = MoeGemmPath::Auto;  // grouped GEMM path (env FP4MOE_MOE_GEMM overrides Auto)
  bool w4a4 = false;                // NVFP4 activation emulation (sm90 path only)
  bool fold_shared = true;          // fold a compatible shared expert into the routed GEMMs
};

class MoeLayerCuda {
 public:
  // Uploads the weights (synchronous; throws fp4moe::Error on a bad layer or config).
  MoeLayerCuda(const MoeLayerWeights& w, const MoeCudaOptions& opt);
  // A layer of this config with random NVFP4 weights (moe/random_layer.hpp; the host
  // copy is dropped after the upload) — for benchmarks at full size.
  static std::unique_ptr<MoeLayerCuda> random(const MoeConfig& cfg, const MoeCudaOptions& opt, uint64_t seed);
  ~MoeLayerCuda();
  MoeLayerCuda(const MoeLayerCuda&) = delete;
  MoeLayerCuda& operator=(const MoeLayerCuda&) = delete;

  const MoeConfig& config() const;
  int max_tokens() const;
  std::string describe() const;  // config and the GEMM path of each stack, one line
  std::string gemm_configs(int64_t tokens) const;  // the GEMM configs a forward of T tokens runs

  // x [T, hidden] bf16 (device, 16-byte aligned), out [T, H] f32 or bf16 (device).
  // Enqueue only. Throws before launching anything if T > max_tokens, hidden != H.
  void forward(const uint16_t* x, int64_t tokens, int64_t hidden, float* out, cudaStream_t stream);
  void forward(const uint16_t* x, int64_t tokens, int64_t hidden, uint16_t* out, cudaStream_t stream);

  // Device results of the last forward (valid for its T): [T, k], [T, k], [E+1] — with a
  // folded shared expert [E+n_sh+1] (entries E.. are the shared pieces, T rows each).
  const int32_t* topk_ids() const;
  const float* topk_weights() const;
  const int32_t* expert_offsets() const;

  // Per-stage timing of the next forward() calls: events around each stage; with it on,
  // the shared expert runs serially on the main stream (so each stage is timed alone).
  void set_stage_timing(bool on);
  std::array<float, kNumMoeStages> last_stage_ms() const;  // syncs on the last forward's events

  // CUDA graphs per token bucket on the layer's own buffers (see the header comment).
  uint16_t* graph_input();   // [max_tokens, H] bf16
  float* graph_output();     // [max_tokens, H] f32
  void capture_graph(int64_t bucket_tokens);
  void replay_graph(int64_t tokens, cudaStream_t stream);  // smallest bucket >= tokens
  std::vector<int64_t> graph_buckets() const;

  // Bytes one forward must read for its weights: router, shared expert, and each hit
  // expert's gate_up + down (given how many experts were hit).
  size_t router_bytes() const;
  size_t shared_bytes() const;  // the shared expert's weights once (folded: its n_sh pieces)
  size_t expert_bytes() const;  // one routed expert (gate_up + down)
  // n_sh when the shared expert is folded into the routed GEMMs, else 0 (then it is the
  // separate "shared" stage).
  int64_t shared_folded_pieces() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One-shot helper for the CLI (run-moe --backend cuda): uploads, runs, downloads.
// x [tokens, hidden] f32 on the host (rounded to bf16 for the GPU).
MoeOutput moe_forward_cuda(const MoeLayerWeights& w, const float* x, int64_t tokens, int64_t hidden,
                           MoeGemmPath gemm = MoeGemmPath::Auto, bool fold_shared = true);

}  // namespace fp4moe
