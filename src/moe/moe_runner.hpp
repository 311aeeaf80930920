// A small runner for one MoE layer (tests, `fp4moe bench moe`, `run-moe --backend cuda`),
// until the model runner (engine/) owns streams, workspaces and graphs for every layer.
// It holds what the stateless MoeLayerCuda does not: a stream, a zeroed workspace, the
// input / output buffers graphs are captured on, stage-timing events, and one graph per
// tokens bucket.
//
// Graphs: a graph bakes its launch shapes (grid sizes, the router's path), so capture_graph(B)
// records one graph per token BUCKET on the runner's own graph_input() / graph_output(). For a
// batch of T tokens, write them into graph_input() rows [0, T), replay_graph(T) runs the
// smallest captured bucket >= T, and rows [0, T) of graph_output() are the result. MoE rows
// are independent (nothing mixes tokens), so the padding rows [T, bucket) change nothing for
// the real rows; they only cost their share of work. A replay equals the eager forward of the
// same B rows bit for bit (tested).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "cpu/moe_cpu.hpp"
#include "cuda/common/device_buffer.hpp"
#include "moe/moe_layer_cuda.hpp"

namespace fp4moe {

class MoeLayerRunner {
 public:
  // A workspace for up to max_tokens tokens (<= the layer's), zeroed; a stream (blocking: ordered
  // after work on the default stream).
  MoeLayerRunner(const MoeLayerCuda& layer, int64_t max_tokens);
  ~MoeLayerRunner();
  MoeLayerRunner(const MoeLayerRunner&) = delete;
  MoeLayerRunner& operator=(const MoeLayerRunner&) = delete;

  const MoeLayerCuda& layer() const { return layer_; }
  cudaStream_t stream() const { return stream_; }
  MoeWorkspace workspace() const { return {ws_.ptr(), ws_.bytes()}; }
  int64_t max_tokens() const { return max_tokens_; }

  // layer.forward on stream() into the runner's workspace (enqueue only).
  void forward(const uint16_t* x, int64_t tokens, float* out);
  // The same with events around every stage; waits for it and returns each stage's ms (0 for a
  // stage that did not run: "shared" with a folded shared expert).
  std::array<float, kNumMoeStages> forward_timed(const uint16_t* x, int64_t tokens, float* out);
  // The last forward's routing (device pointers into the workspace).
  MoeRoutingView routing(int64_t tokens) const { return layer_.routing(workspace(), tokens); }

  // Graphs per bucket on the runner's own buffers (see above).
  uint16_t* graph_input() const { return g_in_.as<uint16_t>(); }   // [max_tokens, H] bf16 (zeros at first)
  float* graph_output() const { return g_out_.as<float>(); }       // [max_tokens, H] f32
  void capture_graph(int64_t bucket_tokens);
  void replay_graph(int64_t tokens);  // on stream(): the smallest bucket >= tokens
  std::vector<int64_t> graph_buckets() const;

 private:
  const MoeLayerCuda& layer_;
  int64_t max_tokens_ = 0;
  cuda::DeviceBuffer ws_, g_in_, g_out_;
  cudaStream_t stream_ = nullptr, capture_ = nullptr;
  MoeStageEvents events_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
};

// One-shot helper for the CLI (run-moe --backend cuda): uploads, runs, downloads. x
// [tokens, hidden] f32 on the host (rounded to bf16 for the GPU). The result carries the
// router logits the GPU computed.
MoeOutput moe_forward_cuda(const MoeLayerWeights& w, const float* x, int64_t tokens,
                           MoeGemmPath gemm = MoeGemmPath::Auto, bool fold_shared = true);

}  // namespace fp4moe
