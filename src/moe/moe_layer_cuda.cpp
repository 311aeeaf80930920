// MoeLayerCuda: weights on the device, fixed workspaces, the enqueue-only forward, graphs.
// See moe_layer_cuda.hpp for the data flow and the graph-bucket contract.
#include "moe/moe_layer_cuda.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/permute/permute.hpp"
#include "cuda/routing/router.hpp"
#include "moe/expert_gemm.hpp"
#include "moe/random_layer.hpp"
#include "moe/shared_fold.hpp"

namespace fp4moe {

const char* moe_stage_name(MoeStage s) {
  switch (s) {
    case MoeStage::Router: return "router";
    case MoeStage::Permute: return "permute";
    case MoeStage::Gemm1: return "gemm1";
    case MoeStage::Gemm2: return "gemm2";
    case MoeStage::Shared: return "shared";
    case MoeStage::Combine: return "combine";
  }
  return "?";
}

namespace {

// One cudaMalloc, freed on destruction.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) FP4MOE_CUDA_CHECK(cudaMalloc(&ptr, n));
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    return *this;
  }
};

// Carves one allocation into 256-byte aligned pieces (sizes first, then pointers).
class Carver {
 public:
  template <typename T>
  void add(T*& p, size_t count) { items_.push_back({reinterpret_cast<void**>(&p), count * sizeof(T)}); }
  size_t bytes() const {
    size_t b = 0;
    for (const auto& it : items_) b += (it.bytes + 255) / 256 * 256;
    return b;
  }
  void assign(void* base) const {
    char* p = static_cast<char*>(base);
    for (const auto& it : items_) {
      *it.slot = p;
      p += (it.bytes + 255) / 256 * 256;
    }
  }

 private:
  struct Item { void** slot; size_t bytes; };
  std::vector<Item> items_;
};

void check_stack(const ExpertStack& s, const char* what, int64_t experts, int64_t n, int64_t k) {
  FP4MOE_CHECK(s.is_fp4(), "{}: the CUDA MoE layer needs FP4 (NVFP4/MXFP4) experts, got {}", what,
               weight_format_name(s.format));
  FP4MOE_CHECK(s.num_experts == experts && s.n == n && s.k == k,
               "{}: shape [{}, {}, {}], expected [{}, {}, {}]", what, s.num_experts, s.n, s.k, experts, n, k);
}

}  // namespace

struct MoeLayerCuda::Impl {
  MoeConfig cfg;
  MoeCudaOptions opt;
  cuda::RouterDesc router;
  bool has_shared = false;   // the layer has a shared expert ...
  int64_t n_sh = 0;          // ... folded into w13/w2 as experts E..E+n_sh-1 (0: run separately)

  DeviceBuffer router_w, router_bias;  // f32 [E, H], f32 [E] (may be empty)
  std::unique_ptr<moe::ExpertGemmWeights> w13, w2, sw13, sw2;

  // Workspaces (one allocation), sized from max_tokens.
  DeviceBuffer ws;
  float* logits = nullptr;         // [Tm, E]
  int32_t* ids = nullptr;          // [Tm, k]
  float* weights = nullptr;        // [Tm, k]
  int32_t* offsets = nullptr;      // [E+n_sh+1]
  int32_t* row_pair = nullptr;     // [Tm*R]   (R = k + n_sh rows per token)
  int32_t* pair_row = nullptr;     // [Tm*R]
  float* row_weight = nullptr;     // [Tm*R]
  int32_t* perm_scratch = nullptr; // permute_scratch_bytes
  uint16_t* x_perm = nullptr;      // [Tm*R, H] bf16
  uint16_t* h = nullptr;           // [Tm*R, I] bf16
  uint16_t* y = nullptr;           // [Tm*R, H] bf16
  int32_t* sh_offsets = nullptr;   // [2]
  uint16_t* sh_h = nullptr;        // [Tm, SI] bf16
  uint16_t* sh_y = nullptr;        // [Tm, H] bf16
  uint16_t* g_in = nullptr;        // [Tm, H] bf16 graph input
  float* g_out = nullptr;          // [Tm, H] f32 graph output
  uint8_t* gemm_ws = nullptr;      // the routed GEMMs' own workspace (max of the two)
  uint8_t* gemm_ws_sh = nullptr;   // the shared expert's (it may run concurrently)
  uint8_t* router_ws = nullptr;    // cuda::router_workspace_bytes (zeroed once)
  size_t gemm_ws_bytes = 0, gemm_ws_sh_bytes = 0, router_ws_bytes = 0;

  cudaStream_t side = nullptr, capture = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  bool timing = false;
  std::array<cudaEvent_t, 2 * kNumMoeStages> stage_ev{};
  std::array<bool, kNumMoeStages> stage_ran{};
  std::map<int64_t, cudaGraphExec_t> graphs;

  ~Impl() {
    for (auto& [t, g] : graphs) cudaGraphExecDestroy(g);
    for (cudaEvent_t e : stage_ev)
      if (e) cudaEventDestroy(e);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (side) cudaStreamDestroy(side);
    if (capture) cudaStreamDestroy(capture);
  }

  int64_t H() const { return cfg.hidden; }
  int64_t K() const { return cfg.top_k; }
  int64_t R() const { return cfg.top_k + n_sh; }  // rows per token in the routed GEMMs
  bool separate_shared() const { return has_shared && n_sh == 0; }

  void init_runtime() {
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
    FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    for (cudaEvent_t& e : stage_ev) FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
  }

  void alloc_workspaces() {
    const int64_t Tm = opt.max_tokens, E = cfg.num_experts, Hd = H(), I = cfg.inter, k = K();
    const int64_t P = Tm * R();  // the folded shared pieces add Tm * n_sh rows
    const int64_t SI = cfg.shared_inter;
    gemm_ws_bytes = std::max(w13->workspace_bytes(), w2->workspace_bytes());
    gemm_ws_sh_bytes = separate_shared() ? std::max(sw13->workspace_bytes(), sw2->workspace_bytes()) : 0;
    router_ws_bytes = cuda::router_workspace_bytes(Tm, int(E));
    Carver c;
    c.add(router_ws, router_ws_bytes);
    c.add(logits, size_t(Tm * E));
    c.add(ids, size_t(Tm * k));
    c.add(weights, size_t(Tm * k));
    c.add(offsets, size_t(E + n_sh + 1));
    c.add(row_pair, size_t(P));
    c.add(pair_row, size_t(P));
    c.add(row_weight, size_t(P));
    c.add(perm_scratch, cuda::permute_scratch_bytes(P, int(E + n_sh)) / sizeof(int32_t));
    c.add(x_perm, size_t(P * Hd));
    c.add(h, size_t(P * I));
    c.add(y, size_t(P * Hd));
    c.add(g_in, size_t(Tm * Hd));
    c.add(g_out, size_t(Tm * Hd));
    if (separate_shared()) {
      c.add(sh_offsets, 2);
      c.add(sh_h, size_t(Tm * SI));
      c.add(sh_y, size_t(Tm * Hd));
    }
    if (gemm_ws_bytes) c.add(gemm_ws, gemm_ws_bytes);
    if (gemm_ws_sh_bytes) c.add(gemm_ws_sh, gemm_ws_sh_bytes);
    ws = DeviceBuffer(c.bytes());
    c.assign(ws.ptr);
    // Finite padding rows for graph buckets (never NaN garbage through the router).
    FP4MOE_CUDA_CHECK(cudaMemset(g_in, 0, size_t(Tm * Hd) * 2));
    FP4MOE_CUDA_CHECK(cudaMemset(router_ws, 0, router_ws_bytes));  // route() keeps it at 0
    log_debug("moe layer: {:.1f} MiB of workspaces for {} tokens", double(c.bytes()) / (1 << 20), Tm);
  }

  void stage_begin(MoeStage s, cudaStream_t st) {
    if (timing) FP4MOE_CUDA_CHECK(cudaEventRecord(stage_ev[2 * int(s)], st));
  }
  void stage_end(MoeStage s, cudaStream_t st) {
    if (timing) {
      FP4MOE_CUDA_CHECK(cudaEventRecord(stage_ev[2 * int(s) + 1], st));
      stage_ran[int(s)] = true;
    }
  }

  void run_shared(const uint16_t* x, int64_t T, cudaStream_t st) {
    cuda::fill_single_expert_offsets(sh_offsets, int(T), st);
    sw13->run(cuda::Epilogue::SiluMul, x, sh_offsets, nullptr, sh_h, T, gemm_ws_sh, st);
    sw2->run(cuda::Epilogue::None, sh_h, sh_offsets, nullptr, sh_y, T, gemm_ws_sh, st);
  }

  template <typename Out>
  void forward(const uint16_t* x, int64_t T, int64_t hidden, Out* out, cudaStream_t st) {
    FP4MOE_CHECK(hidden == H(), "MoE layer: input hidden size {} != the layer's {}", hidden, H());
    FP4MOE_CHECK(T >= 0 && T <= opt.max_tokens,
                 "MoE layer: {} tokens exceed the workspace maximum of {} (max_tokens)", T, opt.max_tokens);
    FP4MOE_CHECK(x && out, "MoE layer: null input or output pointer");
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "MoE layer: input must be 16-byte aligned");
    stage_ran.fill(false);
    if (T == 0) return;
    const int64_t E = cfg.num_experts, k = K(), P = T * R();
    const bool separate = separate_shared();
    const bool overlap = separate && opt.shared_side_stream && !timing;
    if (overlap) {
      FP4MOE_CUDA_CHECK(cudaEventRecord(fork, st));
      FP4MOE_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
      run_shared(x, T, side);
      FP4MOE_CUDA_CHECK(cudaEventRecord(join, side));
    }

    stage_begin(MoeStage::Router, st);
    cuda::route(router, x, static_cast<const float*>(router_w.ptr), static_cast<const float*>(router_bias.ptr),
                int(T), int(H()), logits, ids, weights, {router_ws, router_ws_bytes}, st);
    stage_end(MoeStage::Router, st);

    stage_begin(MoeStage::Permute, st);
    cuda::PermuteArgs pa;
    pa.topk_ids = ids;
    pa.topk_weights = weights;
    pa.tokens = int(T);
    pa.top_k = int(k);
    pa.num_experts = int(E);
    pa.extra_experts = int(n_sh);  // the folded shared pieces: experts E.., weight 1
    pa.expert_offsets = offsets;
    pa.row_pair = row_pair;
    pa.pair_row = pair_row;
    pa.row_weight = row_weight;
    pa.scratch = perm_scratch;
    pa.x = x;  // gather fused into the permutation (one launch at small T)
    pa.x_perm = x_perm;
    pa.hidden = int(H());
    cuda::build_permutation(pa, st);
    stage_end(MoeStage::Permute, st);

    stage_begin(MoeStage::Gemm1, st);
    w13->run(cuda::Epilogue::SiluMul, x_perm, offsets, nullptr, h, P, gemm_ws, st);
    stage_end(MoeStage::Gemm1, st);
    stage_begin(MoeStage::Gemm2, st);
    w2->run(cuda::Epilogue::RowScale, h, offsets, row_weight, y, P, gemm_ws, st);
    stage_end(MoeStage::Gemm2, st);

    if (separate && !overlap) {
      stage_begin(MoeStage::Shared, st);
      run_shared(x, T, st);
      stage_end(MoeStage::Shared, st);
    }
    if (overlap) FP4MOE_CUDA_CHECK(cudaStreamWaitEvent(st, join, 0));

    stage_begin(MoeStage::Combine, st);
    cuda::combine_rows(y, pair_row, separate ? sh_y : nullptr, int(T), int(R()), int(H()), out, st);
    stage_end(MoeStage::Combine, st);
  }
};

MoeLayerCuda::MoeLayerCuda(const MoeLayerWeights& w, const MoeCudaOptions& opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const MoeConfig& c = w.cfg;
  FP4MOE_CHECK(c.hidden > 0 && c.inter > 0 && c.num_experts > 0 && c.top_k > 0,
               "MoE layer: bad config (hidden {}, inter {}, experts {}, top_k {})", c.hidden, c.inter,
               c.num_experts, c.top_k);
  FP4MOE_CHECK(c.hidden % 8 == 0, "MoE layer: hidden = {} must be a multiple of 8 on the GPU", c.hidden);
  FP4MOE_CHECK(opt.max_tokens >= 1, "MoE layer: max_tokens = {} must be >= 1", opt.max_tokens);
  FP4MOE_CHECK(int64_t(opt.max_tokens) * c.top_k < (int64_t(1) << 31),
               "MoE layer: max_tokens {} x top_k {} overflows int32", opt.max_tokens, c.top_k);
  m.cfg = c;
  m.opt = opt;
  m.router = cuda::router_desc_from(c);
  cuda::check_router_desc(m.router);
  FP4MOE_CHECK(int64_t(w.router_w.size()) == c.num_experts * c.hidden, "MoE layer: router weight has {} values, expected {} x {}",
               w.router_w.size(), c.num_experts, c.hidden);
  FP4MOE_CHECK(w.router_bias.empty() || int64_t(w.router_bias.size()) == c.num_experts,
               "MoE layer: router bias has {} values, expected {}", w.router_bias.size(), c.num_experts);
  check_stack(w.w13, "gate_up experts", c.num_experts, 2 * c.inter, c.hidden);
  check_stack(w.w2, "down experts", c.num_experts, c.hidden, c.inter);
  m.has_shared = c.shared_inter > 0;
  if (m.has_shared) {
    FP4MOE_CHECK(w.shared_w13 && w.shared_w2, "MoE layer: shared_inter = {} but no shared expert weights",
                 c.shared_inter);
    check_stack(*w.shared_w13, "shared gate_up", 1, 2 * c.shared_inter, c.hidden);
    check_stack(*w.shared_w2, "shared down", 1, c.hidden, c.shared_inter);
  }

  m.init_runtime();
  m.router_w = DeviceBuffer(w.router_w.size() * sizeof(float));
  FP4MOE_CUDA_CHECK(cudaMemcpy(m.router_w.ptr, w.router_w.data(), m.router_w.bytes, cudaMemcpyHostToDevice));
  if (!w.router_bias.empty()) {
    m.router_bias = DeviceBuffer(w.router_bias.size() * sizeof(float));
    FP4MOE_CUDA_CHECK(
        cudaMemcpy(m.router_bias.ptr, w.router_bias.data(), m.router_bias.bytes, cudaMemcpyHostToDevice));
  }
  const int64_t Tm = opt.max_tokens, k = c.top_k;
  if (m.has_shared && opt.fold_shared) {
    std::string why;
    const int64_t max_pieces =
        std::min<int64_t>(cuda::kMaxPermuteExtraExperts, cuda::kMaxPermuteExperts - c.num_experts);
    m.n_sh = moe::shared_fold_pieces(w, max_pieces, &why);
    if (m.n_sh == 0) log_info("moe layer: shared expert runs separately (not foldable: {})", why);
    if (int64_t(opt.max_tokens) * (k + m.n_sh) >= (int64_t(1) << 31)) m.n_sh = 0;  // rows would overflow int32
  }
  if (m.n_sh > 0) {
    const moe::SharedPieces pieces = moe::split_shared_expert(w, m.n_sh);
    const int64_t R = k + m.n_sh;
    m.w13 = moe::upload_expert_gemm({&w.w13, &pieces.w13}, cuda::Epilogue::SiluMul, Tm * R, int(R), int(m.n_sh),
                                    opt.gemm, opt.w4a4);
    m.w2 = moe::upload_expert_gemm({&w.w2, &pieces.w2}, cuda::Epilogue::RowScale, Tm * R, int(R), int(m.n_sh),
                                   opt.gemm, opt.w4a4);
  } else {
    m.w13 = moe::upload_expert_gemm(w.w13, cuda::Epilogue::SiluMul, Tm * k, int(k), opt.gemm, opt.w4a4);
    m.w2 = moe::upload_expert_gemm(w.w2, cuda::Epilogue::RowScale, Tm * k, int(k), opt.gemm, opt.w4a4);
  }
  if (m.separate_shared()) {
    m.sw13 = moe::upload_expert_gemm(*w.shared_w13, cuda::Epilogue::SiluMul, Tm, 1, opt.gemm, opt.w4a4);
    m.sw2 = moe::upload_expert_gemm(*w.shared_w2, cuda::Epilogue::None, Tm, 1, opt.gemm, opt.w4a4);
  }
  m.alloc_workspaces();
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  log_info("moe layer on the GPU: H {} I {} E {} top-{} shared {}{}; GEMM {} / {}; max {} tokens", c.hidden, c.inter,
           c.num_experts, c.top_k, c.shared_inter, m.n_sh ? fmt::format(" (folded: {} experts)", m.n_sh) : "",
           m.w13->describe(), m.w2->describe(), opt.max_tokens);
}

MoeLayerCuda::~MoeLayerCuda() = default;

std::unique_ptr<MoeLayerCuda> MoeLayerCuda::random(const MoeConfig& cfg, const MoeCudaOptions& opt, uint64_t seed) {
  const MoeLayerWeights w = moe::random_moe_layer(cfg, seed);
  return std::make_unique<MoeLayerCuda>(w, opt);
}

const MoeConfig& MoeLayerCuda::config() const { return impl_->cfg; }
int MoeLayerCuda::max_tokens() const { return impl_->opt.max_tokens; }

std::string MoeLayerCuda::gemm_configs(int64_t tokens) const {
  const Impl& m = *impl_;
  const int64_t rows = tokens * m.R();
  return fmt::format("gemm1 {}; gemm2 {}{}", m.w13->config_for(rows), m.w2->config_for(rows),
                     m.separate_shared() ? fmt::format("; shared {} / {}", m.sw13->config_for(tokens), m.sw2->config_for(tokens))
                                  : std::string());
}

std::string MoeLayerCuda::describe() const {
  const Impl& m = *impl_;
  return fmt::format("H {} I {} E {} top-{} shared {}; gate_up: {}; down: {}{}; max_tokens {}", m.cfg.hidden,
                     m.cfg.inter, m.cfg.num_experts, m.cfg.top_k, m.cfg.shared_inter, m.w13->describe(),
                     m.w2->describe(),
                     m.n_sh ? fmt::format("; shared: folded into gate_up/down as {} always-selected expert(s)", m.n_sh)
                     : m.has_shared ? "; shared: separate, " + m.sw13->describe()
                                    : std::string(),
                     m.opt.max_tokens);
}

void MoeLayerCuda::forward(const uint16_t* x, int64_t tokens, int64_t hidden, float* out, cudaStream_t stream) {
  impl_->forward(x, tokens, hidden, out, stream);
}
void MoeLayerCuda::forward(const uint16_t* x, int64_t tokens, int64_t hidden, uint16_t* out, cudaStream_t stream) {
  impl_->forward(x, tokens, hidden, out, stream);
}

const int32_t* MoeLayerCuda::topk_ids() const { return impl_->ids; }
const float* MoeLayerCuda::topk_weights() const { return impl_->weights; }
const int32_t* MoeLayerCuda::expert_offsets() const { return impl_->offsets; }

void MoeLayerCuda::set_stage_timing(bool on) { impl_->timing = on; }

std::array<float, kNumMoeStages> MoeLayerCuda::last_stage_ms() const {
  std::array<float, kNumMoeStages> ms{};
  for (int s = 0; s < kNumMoeStages; ++s) {
    if (!impl_->stage_ran[s]) continue;
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(impl_->stage_ev[2 * s + 1]));
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms[s], impl_->stage_ev[2 * s], impl_->stage_ev[2 * s + 1]));
  }
  return ms;
}

uint16_t* MoeLayerCuda::graph_input() { return impl_->g_in; }
float* MoeLayerCuda::graph_output() { return impl_->g_out; }

void MoeLayerCuda::capture_graph(int64_t bucket) {
  Impl& m = *impl_;
  FP4MOE_CHECK(bucket >= 1 && bucket <= m.opt.max_tokens, "MoE layer: graph bucket {} outside 1..{}", bucket,
               m.opt.max_tokens);
  FP4MOE_CHECK(!m.timing, "MoE layer: turn stage timing off before capturing a graph");
  if (auto it = m.graphs.find(bucket); it != m.graphs.end()) {
    cudaGraphExecDestroy(it->second);
    m.graphs.erase(it);
  }
  // Warm-up outside the capture: first-call initialisation (cuBLAS heuristics, module
  // loads) must not happen inside it.
  m.forward(m.g_in, bucket, m.H(), m.g_out, m.capture);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(m.capture));
  cudaGraph_t graph = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(m.capture, cudaStreamCaptureModeRelaxed));
  try {
    m.forward(m.g_in, bucket, m.H(), m.g_out, m.capture);
  } catch (...) {
    cudaStreamEndCapture(m.capture, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  FP4MOE_CUDA_CHECK(cudaStreamEndCapture(m.capture, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FP4MOE_CUDA_CHECK(err);
  m.graphs[bucket] = exec;
}

void MoeLayerCuda::replay_graph(int64_t tokens, cudaStream_t stream) {
  Impl& m = *impl_;
  auto it = m.graphs.lower_bound(tokens);
  FP4MOE_CHECK(it != m.graphs.end(), "MoE layer: no captured graph bucket holds {} tokens (largest: {})", tokens,
               m.graphs.empty() ? int64_t(0) : m.graphs.rbegin()->first);
  FP4MOE_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
}

std::vector<int64_t> MoeLayerCuda::graph_buckets() const {
  std::vector<int64_t> b;
  for (const auto& [t, g] : impl_->graphs) b.push_back(t);
  return b;
}

size_t MoeLayerCuda::router_bytes() const {
  return size_t(impl_->cfg.num_experts) * size_t(impl_->cfg.hidden + 1) * sizeof(float);
}
size_t MoeLayerCuda::shared_bytes() const {
  const Impl& m = *impl_;
  if (m.n_sh > 0) return size_t(m.n_sh) * expert_bytes();  // the pieces are routed-shaped experts
  return m.has_shared ? m.sw13->weight_bytes_per_expert() + m.sw2->weight_bytes_per_expert() : 0;
}
int64_t MoeLayerCuda::shared_folded_pieces() const { return impl_->n_sh; }
size_t MoeLayerCuda::expert_bytes() const {
  return impl_->w13->weight_bytes_per_expert() + impl_->w2->weight_bytes_per_expert();
}

MoeOutput moe_forward_cuda(const MoeLayerWeights& w, const float* x, int64_t tokens, int64_t hidden,
                           MoeGemmPath gemm, bool fold_shared) {
  FP4MOE_CHECK(cuda::device_available(), "the cuda backend needs a CUDA GPU, and none is visible");
  FP4MOE_CHECK(tokens >= 1, "moe_forward_cuda: {} tokens", tokens);
  FP4MOE_CHECK(hidden == w.cfg.hidden, "moe_forward_cuda: input hidden size {} != the layer's {}", hidden,
               w.cfg.hidden);
  MoeCudaOptions opt;
  opt.max_tokens = int(tokens);
  opt.gemm = gemm;
  opt.fold_shared = fold_shared;
  MoeLayerCuda layer(w, opt);
  const size_t n = size_t(tokens * hidden);
  std::vector<uint16_t> xb(n);
  for (size_t i = 0; i < n; ++i) xb[i] = float_to_bf16(x[i]);
  DeviceBuffer dx(n * 2), dout(n * 4);
  FP4MOE_CUDA_CHECK(cudaMemcpy(dx.ptr, xb.data(), n * 2, cudaMemcpyHostToDevice));
  layer.forward(static_cast<const uint16_t*>(dx.ptr), tokens, hidden, static_cast<float*>(dout.ptr), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  MoeOutput o;
  o.out.resize(n);
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.out.data(), dout.ptr, n * 4, cudaMemcpyDeviceToHost));
  const size_t pk = size_t(tokens * w.cfg.top_k);
  o.routing.tokens = tokens;
  o.routing.top_k = w.cfg.top_k;
  o.routing.topk_ids.resize(pk);
  o.routing.topk_weights.resize(pk);
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.routing.topk_ids.data(), layer.topk_ids(), pk * 4, cudaMemcpyDeviceToHost));
  FP4MOE_CUDA_CHECK(cudaMemcpy(o.routing.topk_weights.data(), layer.topk_weights(), pk * 4, cudaMemcpyDeviceToHost));
  return o;
}

}  // namespace fp4moe
