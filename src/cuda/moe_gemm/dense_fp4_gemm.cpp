// The dense FP4 GEMM (E = 1), host side: see dense_fp4_gemm.hpp.
#include "cuda/moe_gemm/dense_fp4_gemm.hpp"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe::cuda {
namespace {

// The grouped kernels' tokens buckets (moe/expert_gemm.hpp's tokens_bucket_index): bucket b
// holds T in (2^(b-1), 2^b], bucket 0 T = 1.
int bucket_of(int64_t tokens) { return tokens <= 1 ? 0 : int(std::bit_width(uint64_t(tokens - 1))); }

MoeGemmDesc dense_desc(WeightFormat format, int64_t n, int64_t k, int64_t max_tokens) {
  MoeGemmDesc d;
  d.num_experts = 1;
  d.n = int(n);
  d.k = int(k);
  d.max_tokens = int(max_tokens);
  d.weight = format;
  d.act = ActFormat::BF16;
  d.epilogue = Epilogue::None;
  return d;
}

// The linear-layout weights a Generic call would see (shape and format only).
LinearFp4Weights shape_only(const MoeGemmDesc& d) {
  LinearFp4Weights w;
  w.format = d.weight;
  w.num_experts = 1;
  w.n = d.n;
  w.k = d.k;
  return w;
}

MoeGemmArgs dense_args(const void* x, const int32_t* offsets, void* y, int64_t tokens, void* workspace,
                       cudaStream_t stream) {
  MoeGemmArgs a;
  a.x = x;
  a.expert_offsets = offsets;
  a.y = y;
  a.m_total = int(tokens);
  a.workspace = workspace;
  a.stream = stream;
  return a;
}

}  // namespace

const char* dense_fp4_kernel_name(DenseFp4Kernel k) { return k == DenseFp4Kernel::Sm90 ? "sm90" : "generic"; }

std::string dense_fp4_can_implement(DenseFp4Kernel kernel, WeightFormat format, int64_t n, int64_t k,
                                    int64_t max_tokens, int sm) {
  if (format != WeightFormat::NVFP4 && format != WeightFormat::MXFP4)
    return fmt::format("the dense FP4 GEMM takes NVFP4 or MXFP4 weights, not {}", weight_format_name(format));
  if (n <= 0 || k <= 0 || n >= (int64_t(1) << 31) || k >= (int64_t(1) << 31))
    return fmt::format("bad shape [{} x {}]", n, k);
  if (max_tokens < 1 || max_tokens >= (int64_t(1) << 31))
    return fmt::format("max_tokens = {} outside [1, 2^31)", max_tokens);
  const MoeGemmDesc d = dense_desc(format, n, k, max_tokens);
  if (kernel == DenseFp4Kernel::Generic) return generic_can_implement(d, shape_only(d));
  // Sm90: every bucket's default config must fit (they differ in block_n and stages only).
  for (int b = 0; b <= bucket_of(max_tokens); ++b) {
    const int64_t tokens = std::min<int64_t>(int64_t(1) << b, max_tokens);
    if (std::string why = can_implement(d, default_config(d, double(tokens)), sm); !why.empty()) return why;
  }
  return {};
}

DenseFp4Gemm::DenseFp4Gemm(const ExpertStack& w, DenseFp4Kernel kernel, int64_t max_tokens, StagedUpload* staging)
    : kernel_(kernel) {
  FP4MOE_CHECK(w.num_experts == 1, "dense FP4 GEMM: one weight (E = 1) expected, got {} experts", w.num_experts);
  FP4MOE_CHECK(!w.is_view() || w.views.size() == 1, "dense FP4 GEMM: a view of one part expected, got {} parts",
               w.views.size());
  // The device that runs it: what can_implement checks against (Generic ignores it).
  const int sm = kernel == DenseFp4Kernel::Sm90 ? current_device().cc : 0;
  if (std::string why = dense_fp4_can_implement(kernel, w.format, w.n, w.k, max_tokens, sm); !why.empty())
    FP4MOE_FAIL("dense FP4 GEMM [{} x {}] on {}: {}", w.n, w.k, dense_fp4_kernel_name(kernel), why);
  desc_ = dense_desc(w.format, w.n, w.k, max_tokens);
  weight_bytes_ = w.weight_bytes_per_expert();
  if (kernel == DenseFp4Kernel::Generic) {
    generic_ = w.is_view() ? DeviceLinearFp4Weights(owned_expert_stack(w)) : DeviceLinearFp4Weights(w);
    return;
  }
  for (const TileConfig& c : candidate_configs(desc_)) ws_bytes_ = std::max(ws_bytes_, cuda::workspace_bytes(desc_, c));
  for (int b = 0; b <= bucket_of(max_tokens); ++b)
    plans_.push_back(default_config(desc_, double(std::min<int64_t>(int64_t(1) << b, max_tokens))));
  sm90_ = upload_weights_concat({&w}, Epilogue::None, nullptr, staging);
}

void DenseFp4Gemm::run(const void* x, const int32_t* offsets, void* y, int64_t tokens, void* workspace,
                       cudaStream_t stream) const {
  FP4MOE_CHECK(tokens >= 0 && tokens <= desc_.max_tokens, "dense FP4 GEMM [{} x {}]: {} rows outside [0, {}]",
               desc_.n, desc_.k, tokens, desc_.max_tokens);
  const MoeGemmArgs a = dense_args(x, offsets, y, tokens, workspace, stream);
  if (kernel_ == DenseFp4Kernel::Generic) {
    run_generic_grouped_gemm(desc_, generic_.view(), a);
    return;
  }
  run_moe_gemm(desc_, plans_[size_t(bucket_of(tokens))], sm90_, a);
}

std::string DenseFp4Gemm::describe() const {
  return kernel_ == DenseFp4Kernel::Sm90 ? std::string("sm90 (config per tokens bucket)")
                                         : "generic " + to_string(generic_tile_config());
}

std::string DenseFp4Gemm::config_for(int64_t tokens) const {
  if (kernel_ == DenseFp4Kernel::Generic) return to_string(generic_tile_config());
  return to_string(plans_[size_t(std::min(bucket_of(tokens), int(plans_.size()) - 1))]);
}

}  // namespace fp4moe::cuda
