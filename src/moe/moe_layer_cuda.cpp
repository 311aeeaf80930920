// MoeLayerCuda: weights on the device, the configs and workspace layouts of every tokens
// bucket decided at construction, and the enqueue-only forward over a caller's workspace.
// See moe_layer_cuda.hpp for the data flow.
#include "moe/moe_layer_cuda.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/permute/permute.hpp"
#include "cuda/routing/router.hpp"
#include "moe/expert_gemm.hpp"
#include "moe/random_layer.hpp"
#include "moe/shared_bf16.hpp"
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

void check_stack(const ExpertStack& s, const char* what, int64_t experts, int64_t n, int64_t k) {
  FP4MOE_CHECK(s.is_fp4(), "{}: the CUDA MoE layer needs FP4 (NVFP4/MXFP4) experts, got {}", what,
               weight_format_name(s.format));
  FP4MOE_CHECK(s.num_experts == experts && s.n == n && s.k == k,
               "{}: shape [{}, {}, {}], expected [{}, {}, {}]", what, s.num_experts, s.n, s.k, experts, n, k);
}

constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Byte offsets of every buffer of a forward inside the workspace, for batches of up to
// `tokens` tokens. The router's workspace comes first, so its counters sit at offset 0 for
// every layer sharing the workspace (zeroed once, left at zero by every route()).
struct WorkspaceLayout {
  size_t router_ws = 0, router_ws_bytes = 0;
  size_t logits = 0, ids = 0, weights = 0, offsets = 0;
  size_t row_pair = 0, pair_row = 0, row_weight = 0, perm_scratch = 0;
  size_t x_perm = 0, h = 0, y = 0;
  size_t sh_offsets = 0, sh_h = 0, sh_y = 0;  // separate shared expert only (BF16: sh_y f32, no offsets / h)
  size_t sh_scratch = 0;                      // BF16 shared expert: its gu, h and cuBLASLt workspace
  size_t gemm_ws = 0, gemm_ws_bytes = 0;
  size_t total = 0;
};

}  // namespace

struct MoeLayerCuda::Impl {
  MoeConfig cfg;
  MoeCudaOptions opt;
  cuda::RouterDesc router;
  bool has_shared = false;   // the layer has a shared expert ...
  int64_t n_sh = 0;          // ... folded into w13/w2 as experts E..E+n_sh-1 (0: run separately)

  cuda::DeviceBuffer router_w, router_bias;  // f32 [E, H], f32 [E] (may be empty)
  std::unique_ptr<moe::ExpertGemmWeights> w13, w2, sw13, sw2;
  std::unique_ptr<moe::SharedMlpBf16> sbf16;  // a BF16 shared expert (then sw13 / sw2 are null)
  std::vector<WorkspaceLayout> layouts;  // by tokens bucket index (moe::tokens_bucket_index)

  int64_t H() const { return cfg.hidden; }
  int64_t R() const { return cfg.top_k + n_sh; }  // rows per token in the routed GEMMs
  bool separate_shared() const { return has_shared && n_sh == 0; }

  WorkspaceLayout layout_for(int64_t T) const {
    const int64_t E = cfg.num_experts, Hd = H(), I = cfg.inter, k = cfg.top_k, P = T * R(), SI = cfg.shared_inter;
    WorkspaceLayout L;
    size_t at = 0;
    auto take = [&](size_t& off, size_t bytes) {
      off = at;
      at += align256(bytes);
    };
    L.router_ws_bytes = cuda::router_workspace_bytes(T, int(E));
    take(L.router_ws, L.router_ws_bytes);
    take(L.logits, size_t(T * E) * 4);
    take(L.ids, size_t(T * k) * 4);
    take(L.weights, size_t(T * k) * 4);
    take(L.offsets, size_t(E + n_sh + 1) * 4);
    take(L.row_pair, size_t(P) * 4);
    take(L.pair_row, size_t(P) * 4);
    take(L.row_weight, size_t(P) * 4);
    take(L.perm_scratch, cuda::permute_scratch_bytes(P, int(E + n_sh)));
    take(L.x_perm, size_t(P * Hd) * 2);
    take(L.h, size_t(P * I) * 2);
    take(L.y, size_t(P * Hd) * 2);
    if (sbf16) {
      take(L.sh_y, size_t(T * Hd) * 4);
      take(L.sh_scratch, sbf16->scratch_bytes(T));
    } else if (separate_shared()) {
      take(L.sh_offsets, 2 * 4);
      take(L.sh_h, size_t(T * SI) * 2);
      take(L.sh_y, size_t(T * Hd) * 2);
    }
    L.gemm_ws_bytes = std::max(w13->workspace_bytes(), w2->workspace_bytes());
    if (separate_shared() && !sbf16)
      L.gemm_ws_bytes = std::max({L.gemm_ws_bytes, sw13->workspace_bytes(), sw2->workspace_bytes()});
    take(L.gemm_ws, L.gemm_ws_bytes);
    L.total = at;
    return L;
  }

  const WorkspaceLayout& layout(int64_t T) const {
    const int b = moe::tokens_bucket_index(T);
    FP4MOE_CHECK(T >= 0 && T <= opt.max_tokens && b < int(layouts.size()),
                 "MoE layer: {} tokens exceed the layer's maximum of {} (max_tokens)", T, opt.max_tokens);
    return layouts[size_t(b)];
  }

  template <typename Out>
  void forward(const uint16_t* x, int64_t T, Out* out, MoeWorkspace ws, cudaStream_t st, MoeStageEvents* ev) const {
    const WorkspaceLayout& L = layout(T);
    FP4MOE_CHECK(x && out, "MoE layer: null input or output pointer");
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "MoE layer: input must be 16-byte aligned");
    FP4MOE_CHECK(ws.ptr && reinterpret_cast<uintptr_t>(ws.ptr) % 256 == 0 && ws.bytes >= L.total,
                 "MoE layer: the workspace ({} B at {}) must be 256-byte aligned and hold workspace_bytes({}) = {} B",
                 ws.bytes, fmt::ptr(ws.ptr), T, L.total);
    if (ev) ev->ran.fill(false);
    if (T == 0) return;
    uint8_t* base = static_cast<uint8_t*>(ws.ptr);
    auto at = [base](size_t off) { return base + off; };
    auto* logits = reinterpret_cast<float*>(at(L.logits));
    auto* ids = reinterpret_cast<int32_t*>(at(L.ids));
    auto* weights = reinterpret_cast<float*>(at(L.weights));
    auto* offsets = reinterpret_cast<int32_t*>(at(L.offsets));
    auto* x_perm = reinterpret_cast<uint16_t*>(at(L.x_perm));
    auto* h = reinterpret_cast<uint16_t*>(at(L.h));
    auto* y = reinterpret_cast<uint16_t*>(at(L.y));
    auto* row_weight = reinterpret_cast<float*>(at(L.row_weight));
    auto* pair_row = reinterpret_cast<int32_t*>(at(L.pair_row));
    void* gemm_ws = L.gemm_ws_bytes ? at(L.gemm_ws) : nullptr;
    auto begin = [&](MoeStage s) {
      if (ev) FP4MOE_CUDA_CHECK(cudaEventRecord(ev->begin[size_t(s)], st));
    };
    auto end = [&](MoeStage s) {
      if (!ev) return;
      FP4MOE_CUDA_CHECK(cudaEventRecord(ev->end[size_t(s)], st));
      ev->ran[size_t(s)] = true;
    };

    begin(MoeStage::Router);
    cuda::route(router, x, router_w.as<const float>(), router_bias.as<const float>(), int(T), int(H()), logits, ids,
                weights, {at(L.router_ws), L.router_ws_bytes}, st);
    end(MoeStage::Router);

    begin(MoeStage::Permute);
    cuda::PermuteArgs pa;
    pa.topk_ids = ids;
    pa.topk_weights = weights;
    pa.tokens = int(T);
    pa.top_k = int(cfg.top_k);
    pa.num_experts = int(cfg.num_experts);
    pa.extra_experts = int(n_sh);  // the folded shared pieces: experts E.., weight 1
    pa.expert_offsets = offsets;
    pa.row_pair = reinterpret_cast<int32_t*>(at(L.row_pair));
    pa.pair_row = pair_row;
    pa.row_weight = row_weight;
    pa.scratch = at(L.perm_scratch);
    pa.x = x;  // gather fused into the permutation (one launch at small T)
    pa.x_perm = x_perm;
    pa.hidden = int(H());
    cuda::build_permutation(pa, st);
    end(MoeStage::Permute);

    begin(MoeStage::Gemm1);
    w13->run(cuda::Epilogue::SiluMul, x_perm, offsets, nullptr, h, T, gemm_ws, st);
    end(MoeStage::Gemm1);
    begin(MoeStage::Gemm2);
    w2->run(cuda::Epilogue::RowScale, h, offsets, row_weight, y, T, gemm_ws, st);
    end(MoeStage::Gemm2);

    if (sbf16) {
      begin(MoeStage::Shared);
      auto* sh_y = reinterpret_cast<float*>(at(L.sh_y));
      sbf16->run(x, T, sh_y, at(L.sh_scratch), st);
      end(MoeStage::Shared);
      begin(MoeStage::Combine);
      cuda::combine_rows_f32_shared(y, pair_row, sh_y, int(T), int(R()), int(H()), out, st);
      end(MoeStage::Combine);
      return;
    }
    uint16_t* sh_y = nullptr;
    if (separate_shared()) {
      begin(MoeStage::Shared);
      auto* sh_offsets = reinterpret_cast<int32_t*>(at(L.sh_offsets));
      auto* sh_h = reinterpret_cast<uint16_t*>(at(L.sh_h));
      sh_y = reinterpret_cast<uint16_t*>(at(L.sh_y));
      cuda::fill_single_expert_offsets(sh_offsets, int(T), st);
      sw13->run(cuda::Epilogue::SiluMul, x, sh_offsets, nullptr, sh_h, T, gemm_ws, st);
      sw2->run(cuda::Epilogue::None, sh_h, sh_offsets, nullptr, sh_y, T, gemm_ws, st);
      end(MoeStage::Shared);
    }

    begin(MoeStage::Combine);
    cuda::combine_rows(y, pair_row, sh_y, int(T), int(R()), int(H()), out, st);
    end(MoeStage::Combine);
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
  FP4MOE_CHECK(int64_t(w.router_w.size()) == c.num_experts * c.hidden,
               "MoE layer: router weight has {} values, expected {} x {}", w.router_w.size(), c.num_experts,
               c.hidden);
  FP4MOE_CHECK(w.router_bias.empty() || int64_t(w.router_bias.size()) == c.num_experts,
               "MoE layer: router bias has {} values, expected {}", w.router_bias.size(), c.num_experts);
  check_stack(w.w13, "gate_up experts", c.num_experts, 2 * c.inter, c.hidden);
  check_stack(w.w2, "down experts", c.num_experts, c.hidden, c.inter);
  m.has_shared = c.shared_inter > 0;
  if (m.has_shared) {
    FP4MOE_CHECK(w.shared_w13 && w.shared_w2, "MoE layer: shared_inter = {} but no shared expert weights",
                 c.shared_inter);
    FP4MOE_CHECK(!w.shared_w13->is_view() && !w.shared_w2->is_view(),
                 "MoE layer: the shared expert must be owned (owned_expert_stack), not checkpoint views");
    FP4MOE_CHECK(w.shared_w13->is_fp4() == w.shared_w2->is_fp4(),
                 "MoE layer: shared gate_up is {} but shared down {}: both FP4 or both BF16",
                 weight_format_name(w.shared_w13->format), weight_format_name(w.shared_w2->format));
    if (w.shared_w13->is_fp4()) {
      check_stack(*w.shared_w13, "shared gate_up", 1, 2 * c.shared_inter, c.hidden);
      check_stack(*w.shared_w2, "shared down", 1, c.hidden, c.shared_inter);
    } else {
      FP4MOE_CHECK(w.shared_w13->n == 2 * c.shared_inter && w.shared_w13->k == c.hidden &&
                       w.shared_w2->n == c.hidden && w.shared_w2->k == c.shared_inter,
                   "MoE layer: BF16 shared expert [{}, {}] / [{}, {}], expected [{}, {}] / [{}, {}]",
                   w.shared_w13->n, w.shared_w13->k, w.shared_w2->n, w.shared_w2->k, 2 * c.shared_inter, c.hidden,
                   c.hidden, c.shared_inter);
    }
  }

  m.router_w = cuda::DeviceBuffer::from(w.router_w);
  if (!w.router_bias.empty()) m.router_bias = cuda::DeviceBuffer::from(w.router_bias);
  const int64_t Tm = opt.max_tokens, k = c.top_k;
  // A BF16 shared expert (NVIDIA's NVFP4 checkpoints) runs as a dense cuBLASLt MLP, never folded.
  const bool shared_bf16 = m.has_shared && !w.shared_w13->is_fp4();
  if (m.has_shared && opt.fold_shared && !shared_bf16) {
    std::string why;
    const int64_t max_pieces =
        std::min<int64_t>(cuda::kMaxPermuteExtraExperts, cuda::kMaxPermuteExperts - c.num_experts);
    m.n_sh = moe::shared_fold_pieces(w, max_pieces, &why);
    if (m.n_sh == 0) log_info("moe layer: shared expert runs separately (not foldable: {})", why);
    if (int64_t(opt.max_tokens) * (k + m.n_sh) >= (int64_t(1) << 31)) m.n_sh = 0;  // rows would overflow int32
  }
  if (m.n_sh > 0) {
    const moe::SharedPieces pieces = moe::split_shared_expert(w, m.n_sh);
    const int R = int(k + m.n_sh);
    m.w13 = moe::upload_expert_gemm({&w.w13, &pieces.w13}, cuda::Epilogue::SiluMul, Tm, R, int(m.n_sh), opt.gemm,
                                    opt.w4a4, opt.staging);
    m.w2 = moe::upload_expert_gemm({&w.w2, &pieces.w2}, cuda::Epilogue::RowScale, Tm, R, int(m.n_sh), opt.gemm,
                                   opt.w4a4, opt.staging);
  } else {
    m.w13 = moe::upload_expert_gemm({&w.w13}, cuda::Epilogue::SiluMul, Tm, int(k), 0, opt.gemm, opt.w4a4, opt.staging);
    m.w2 = moe::upload_expert_gemm({&w.w2}, cuda::Epilogue::RowScale, Tm, int(k), 0, opt.gemm, opt.w4a4, opt.staging);
  }
  if (shared_bf16) {
    m.sbf16 = std::make_unique<moe::SharedMlpBf16>(*w.shared_w13, *w.shared_w2, Tm);
  } else if (m.separate_shared()) {
    m.sw13 = moe::upload_expert_gemm({&*w.shared_w13}, cuda::Epilogue::SiluMul, Tm, 1, 0, opt.gemm, opt.w4a4,
                                     opt.staging);
    m.sw2 = moe::upload_expert_gemm({&*w.shared_w2}, cuda::Epilogue::None, Tm, 1, 0, opt.gemm, opt.w4a4, opt.staging);
  }
  for (int b = 0; b <= moe::tokens_bucket_index(Tm); ++b)
    m.layouts.push_back(m.layout_for(std::min<int64_t>(int64_t(1) << b, Tm)));
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  log_info("moe layer on the GPU: H {} I {} E {} top-{} shared {}{}; GEMM {} / {}; max {} tokens "
           "({:.1f} MiB of workspace)",
           c.hidden, c.inter, c.num_experts, c.top_k, c.shared_inter,
           m.n_sh    ? fmt::format(" (folded: {} experts)", m.n_sh)
           : m.sbf16 ? std::string(" (bf16, cuBLASLt)")
                     : std::string(),
           m.w13->describe(), m.w2->describe(),
           opt.max_tokens, double(m.layouts.back().total) / (1 << 20));
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
  return fmt::format("gemm1 {}; gemm2 {}{}", m.w13->config_for(tokens), m.w2->config_for(tokens),
                     m.sbf16 ? "; shared " + m.sbf16->describe()
                     : m.separate_shared()
                         ? fmt::format("; shared {} / {}", m.sw13->config_for(tokens), m.sw2->config_for(tokens))
                         : std::string());
}

std::string MoeLayerCuda::describe() const {
  const Impl& m = *impl_;
  return fmt::format("H {} I {} E {} top-{} shared {}; gate_up: {}; down: {}{}; max_tokens {}", m.cfg.hidden,
                     m.cfg.inter, m.cfg.num_experts, m.cfg.top_k, m.cfg.shared_inter, m.w13->describe(),
                     m.w2->describe(),
                     m.n_sh ? fmt::format("; shared: folded into gate_up/down as {} always-selected expert(s)", m.n_sh)
                     : m.sbf16      ? "; shared: separate, " + m.sbf16->describe()
                     : m.has_shared ? "; shared: separate, " + m.sw13->describe()
                                    : std::string(),
                     m.opt.max_tokens);
}

size_t MoeLayerCuda::workspace_bytes(int64_t tokens) const { return impl_->layout(tokens).total; }

void MoeLayerCuda::forward(const uint16_t* x, int64_t tokens, float* out, MoeWorkspace ws, cudaStream_t stream,
                           MoeStageEvents* events) const {
  impl_->forward(x, tokens, out, ws, stream, events);
}
void MoeLayerCuda::forward(const uint16_t* x, int64_t tokens, uint16_t* out, MoeWorkspace ws, cudaStream_t stream,
                           MoeStageEvents* events) const {
  impl_->forward(x, tokens, out, ws, stream, events);
}

MoeRoutingView MoeLayerCuda::routing(MoeWorkspace ws, int64_t tokens) const {
  const WorkspaceLayout& L = impl_->layout(tokens);
  FP4MOE_CHECK(ws.ptr && ws.bytes >= L.total, "MoE layer: the workspace holds {} B, workspace_bytes({}) = {} B",
               ws.bytes, tokens, L.total);
  const uint8_t* base = static_cast<const uint8_t*>(ws.ptr);
  MoeRoutingView v;
  v.logits = reinterpret_cast<const float*>(base + L.logits);
  v.topk_ids = reinterpret_cast<const int32_t*>(base + L.ids);
  v.topk_weights = reinterpret_cast<const float*>(base + L.weights);
  v.expert_offsets = reinterpret_cast<const int32_t*>(base + L.offsets);
  return v;
}

size_t MoeLayerCuda::router_bytes() const {
  return size_t(impl_->cfg.num_experts) * size_t(impl_->cfg.hidden + 1) * sizeof(float);
}
size_t MoeLayerCuda::shared_bytes() const {
  const Impl& m = *impl_;
  if (m.n_sh > 0) return size_t(m.n_sh) * expert_bytes();  // the pieces are routed-shaped experts
  if (m.sbf16) return m.sbf16->weight_bytes();
  return m.has_shared ? m.sw13->weight_bytes_per_expert() + m.sw2->weight_bytes_per_expert() : 0;
}
int64_t MoeLayerCuda::shared_folded_pieces() const { return impl_->n_sh; }
size_t MoeLayerCuda::expert_bytes() const {
  return impl_->w13->weight_bytes_per_expert() + impl_->w2->weight_bytes_per_expert();
}

}  // namespace fp4moe
