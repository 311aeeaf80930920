// MoeLayerRunner: the stream, workspace, graphs and timing events of one MoE layer (see
// moe_runner.hpp), and the CLI's one-shot helper.
#include "moe/moe_runner.hpp"

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe {

MoeLayerRunner::MoeLayerRunner(const MoeLayerCuda& layer, int64_t max_tokens) : layer_(layer), max_tokens_(max_tokens) {
  FP4MOE_CHECK(max_tokens >= 1 && max_tokens <= layer.max_tokens(),
               "MoE runner: max_tokens {} outside 1..{} (the layer's max_tokens)", max_tokens, layer.max_tokens());
  const int64_t H = layer.config().hidden;
  ws_ = cuda::DeviceBuffer(layer.workspace_bytes(max_tokens));
  g_in_ = cuda::DeviceBuffer(size_t(max_tokens * H) * 2);
  g_out_ = cuda::DeviceBuffer(size_t(max_tokens * H) * 4);
  FP4MOE_CUDA_CHECK(cudaMemset(ws_.ptr(), 0, ws_.bytes()));      // the router's counters start at 0
  FP4MOE_CUDA_CHECK(cudaMemset(g_in_.ptr(), 0, g_in_.bytes()));  // finite padding rows for graph buckets
  // A blocking stream: it stays ordered after the default stream's copies and memsets (how tests
  // and the CLI fill inputs), so no caller has to remember a synchronisation.
  FP4MOE_CUDA_CHECK(cudaStreamCreate(&stream_));
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking));
  for (int s = 0; s < kNumMoeStages; ++s) {
    FP4MOE_CUDA_CHECK(cudaEventCreate(&events_.begin[size_t(s)]));
    FP4MOE_CUDA_CHECK(cudaEventCreate(&events_.end[size_t(s)]));
  }
}

MoeLayerRunner::~MoeLayerRunner() {
  for (auto& [t, g] : graphs_) cudaGraphExecDestroy(g);
  for (int s = 0; s < kNumMoeStages; ++s) {
    if (events_.begin[size_t(s)]) cudaEventDestroy(events_.begin[size_t(s)]);
    if (events_.end[size_t(s)]) cudaEventDestroy(events_.end[size_t(s)]);
  }
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (capture_) cudaStreamDestroy(capture_);
}

void MoeLayerRunner::forward(const uint16_t* x, int64_t tokens, float* out) {
  layer_.forward(x, tokens, out, workspace(), stream_);
}

std::array<float, kNumMoeStages> MoeLayerRunner::forward_timed(const uint16_t* x, int64_t tokens, float* out) {
  layer_.forward(x, tokens, out, workspace(), stream_, &events_);
  std::array<float, kNumMoeStages> ms{};
  for (int s = 0; s < kNumMoeStages; ++s) {
    if (!events_.ran[size_t(s)]) continue;
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(events_.end[size_t(s)]));
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(s)], events_.begin[size_t(s)], events_.end[size_t(s)]));
  }
  return ms;
}

void MoeLayerRunner::capture_graph(int64_t bucket) {
  FP4MOE_CHECK(bucket >= 1 && bucket <= max_tokens_, "MoE runner: graph bucket {} outside 1..{}", bucket, max_tokens_);
  if (auto it = graphs_.find(bucket); it != graphs_.end()) {
    cudaGraphExecDestroy(it->second);
    graphs_.erase(it);
  }
  // Everything queued (the runner's stream, the default stream's input copies) must be done
  // before the buffers are shared with the capture stream.
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  // Warm-up outside the capture: first-call initialisation (module loads, per-device kernel
  // attributes) must not happen inside it.
  layer_.forward(graph_input(), bucket, graph_output(), workspace(), capture_);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(capture_));
  cudaGraph_t graph = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(capture_, cudaStreamCaptureModeRelaxed));
  try {
    layer_.forward(graph_input(), bucket, graph_output(), workspace(), capture_);
  } catch (...) {
    cudaStreamEndCapture(capture_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  FP4MOE_CUDA_CHECK(cudaStreamEndCapture(capture_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FP4MOE_CUDA_CHECK(err);
  graphs_[bucket] = exec;
}

void MoeLayerRunner::replay_graph(int64_t tokens) {
  auto it = graphs_.lower_bound(tokens);
  FP4MOE_CHECK(it != graphs_.end(), "MoE runner: no captured graph bucket holds {} tokens (largest: {})", tokens,
               graphs_.empty() ? int64_t(0) : graphs_.rbegin()->first);
  FP4MOE_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
}

std::vector<int64_t> MoeLayerRunner::graph_buckets() const {
  std::vector<int64_t> b;
  for (const auto& [t, g] : graphs_) b.push_back(t);
  return b;
}

MoeOutput moe_forward_cuda(const MoeLayerWeights& w, const float* x, int64_t tokens, MoeGemmPath gemm,
                           bool fold_shared) {
  FP4MOE_CHECK(cuda::device_available(), "the cuda backend needs a CUDA GPU, and none is visible");
  FP4MOE_CHECK(tokens >= 1, "moe_forward_cuda: {} tokens", tokens);
  MoeCudaOptions opt;
  opt.max_tokens = int(tokens);
  opt.gemm = gemm;
  opt.fold_shared = fold_shared;
  const MoeLayerCuda layer(w, opt);
  MoeLayerRunner runner(layer, tokens);
  const int64_t H = w.cfg.hidden, E = w.cfg.num_experts, k = w.cfg.top_k;
  const size_t n = size_t(tokens * H);
  std::vector<uint16_t> xb(n);
  for (size_t i = 0; i < n; ++i) xb[i] = float_to_bf16(x[i]);
  const cuda::DeviceBuffer dx = cuda::DeviceBuffer::from(xb);
  cuda::DeviceBuffer dout(n * 4);
  runner.forward(dx.as<const uint16_t>(), tokens, dout.as<float>());
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(runner.stream()));
  const MoeRoutingView r = runner.routing(tokens);
  auto download = [](auto* dst, const void* src, size_t count) {
    FP4MOE_CUDA_CHECK(cudaMemcpy(dst, src, count * sizeof(*dst), cudaMemcpyDeviceToHost));
  };
  MoeOutput o;
  o.out = dout.download<float>(n);
  o.routing.tokens = tokens;
  o.routing.top_k = k;
  o.routing.topk_ids.resize(size_t(tokens * k));
  o.routing.topk_weights.resize(size_t(tokens * k));
  o.logits.resize(size_t(tokens * E));
  download(o.routing.topk_ids.data(), r.topk_ids, o.routing.topk_ids.size());
  download(o.routing.topk_weights.data(), r.topk_weights, o.routing.topk_weights.size());
  download(o.logits.data(), r.logits, o.logits.size());
  return o;
}

}  // namespace fp4moe
