// GemmKernel::Generic, host side: weights upload, validation, launch (kernel in the .cu).
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"

#include <cstdint>
#include <utility>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/linear_fp4_kernels.hpp"

namespace fp4moe::cuda {
namespace {

bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

}  // namespace

// ---- weights upload ---------------------------------------------------------------

DeviceLinearFp4Weights::DeviceLinearFp4Weights(const ExpertStack& s)
    : DeviceLinearFp4Weights(std::vector<const ExpertStack*>{&s}) {}

DeviceLinearFp4Weights::DeviceLinearFp4Weights(const std::vector<const ExpertStack*>& stacks) {
  FP4MOE_CHECK(!stacks.empty() && stacks.front() != nullptr, "DeviceLinearFp4Weights: no expert stacks");
  const ExpertStack& f = *stacks.front();
  int64_t E = 0;
  for (const ExpertStack* sp : stacks) {
    FP4MOE_CHECK(sp != nullptr, "DeviceLinearFp4Weights: null expert stack");
    const ExpertStack& s = *sp;
    FP4MOE_CHECK(s.is_fp4(), "DeviceLinearFp4Weights: expert stack is {}, not FP4",
                 weight_format_name(s.format));
    FP4MOE_CHECK(s.num_experts > 0 && s.n > 0 && s.k > 0 && s.k % s.block() == 0,
                 "DeviceLinearFp4Weights: bad shape E={} N={} K={} (K must be a multiple of {})",
                 s.num_experts, s.n, s.k, s.block());
    FP4MOE_CHECK(s.format == f.format && s.n == f.n && s.k == f.k,
                 "DeviceLinearFp4Weights: stacks differ ({} N={} K={} vs {} N={} K={})", weight_format_name(s.format),
                 s.n, s.k, weight_format_name(f.format), f.n, f.k);
    FP4MOE_CHECK(s.packed.size() == size_t(s.num_experts * s.n * (s.k / 2)) &&
                     s.scales.size() == size_t(s.num_experts * s.n * (s.k / s.block())) &&
                     s.global_scale.size() == size_t(s.num_experts),
                 "DeviceLinearFp4Weights: buffer sizes do not match E={} N={} K={}", s.num_experts,
                 s.n, s.k);
    E += s.num_experts;
  }
  const size_t packed_e = size_t(f.n * (f.k / 2)), scales_e = size_t(f.n * (f.k / f.block()));
  const size_t packed = size_t(E) * packed_e;
  const size_t scales = size_t(E) * scales_e;
  const size_t scales_off = (packed + 255) / 256 * 256;
  const size_t globals_off = (scales_off + scales + 255) / 256 * 256;
  buffer_ = DeviceBuffer(globals_off + size_t(E) * 4);
  auto* base = buffer_.as<uint8_t>();
  size_t e0 = 0;
  for (const ExpertStack* sp : stacks) {
    const ExpertStack& s = *sp;
    FP4MOE_CUDA_CHECK(cudaMemcpy(base + e0 * packed_e, s.packed.data(), s.packed.size(), cudaMemcpyHostToDevice));
    FP4MOE_CUDA_CHECK(
        cudaMemcpy(base + scales_off + e0 * scales_e, s.scales.data(), s.scales.size(), cudaMemcpyHostToDevice));
    host_globals_.insert(host_globals_.end(), s.global_scale.begin(), s.global_scale.end());
    e0 += size_t(s.num_experts);
  }
  FP4MOE_CUDA_CHECK(cudaMemcpy(base + globals_off, host_globals_.data(), size_t(E) * 4, cudaMemcpyHostToDevice));
  view_.format = f.format;
  view_.num_experts = int(E);
  view_.n = int(f.n);
  view_.k = int(f.k);
  view_.packed = base;
  view_.scales = base + scales_off;
  view_.global_scale = reinterpret_cast<const float*>(base + globals_off);
  view_.global_scale_host = host_globals_.data();
}

DeviceLinearFp4Weights::DeviceLinearFp4Weights(DeviceLinearFp4Weights&& o) noexcept
    : view_(std::exchange(o.view_, {})), buffer_(std::move(o.buffer_)), host_globals_(std::move(o.host_globals_)) {
  view_.global_scale_host = host_globals_.empty() ? nullptr : host_globals_.data();
}

DeviceLinearFp4Weights& DeviceLinearFp4Weights::operator=(DeviceLinearFp4Weights&& o) noexcept {
  if (this != &o) {
    view_ = std::exchange(o.view_, {});
    buffer_ = std::move(o.buffer_);
    host_globals_ = std::move(o.host_globals_);
    view_.global_scale_host = host_globals_.empty() ? nullptr : host_globals_.data();
  }
  return *this;
}

// ---- the generic tactic -------------------------------------------------------------

TileConfig generic_tile_config() {
  TileConfig c;
  c.kernel = GemmKernel::Generic;
  c.block_m = linear_fp4::kGenericRowsW;
  c.block_n = linear_fp4::kGenericRowsT;
  c.block_k = linear_fp4::kGenericStepK;
  c.stages = 1;
  return c;
}

std::string linear_weights_mismatch(const MoeGemmDesc& d, const LinearFp4Weights& w) {
  if (w.format != d.weight)
    return fmt::format("weights are {}, the GEMM asks for {}", weight_format_name(w.format),
                       weight_format_name(d.weight));
  if (w.num_experts != d.num_experts || w.n != d.n || w.k != d.k)
    return fmt::format("weights are [E={}, N={}, K={}], the GEMM asks for [E={}, N={}, K={}]",
                       w.num_experts, w.n, w.k, d.num_experts, d.n, d.k);
  return {};
}

std::string generic_can_implement(const MoeGemmDesc& d, const LinearFp4Weights& w) {
  if (d.weight == WeightFormat::BF16) return "Generic needs FP4 weights (NVFP4 or MXFP4), got bf16";
  if (d.act != ActFormat::BF16) return "Generic computes W4A16 only (no NVFP4 activation emulation)";
  if (d.num_experts <= 0 || d.n <= 0 || d.k <= 0)
    return fmt::format("bad shape E={} N={} K={}", d.num_experts, d.n, d.k);
  if (d.num_experts > 65535) return fmt::format("E={} exceeds 65535 experts", d.num_experts);
  const int block = d.weight == WeightFormat::MXFP4 ? 32 : 16;
  if (d.k % block != 0)
    return fmt::format("K={} is not a multiple of the {} block size {}", d.k,
                       weight_format_name(d.weight), block);
  if (d.epilogue == Epilogue::SiluMul && d.n % 2 != 0)
    return fmt::format("SiluMul needs an even N (gate and up halves), got N={}", d.n);
  return linear_weights_mismatch(d, w);
}

void run_generic_grouped_gemm(const MoeGemmDesc& d, const LinearFp4Weights& w, const MoeGemmArgs& a) {
  if (std::string why = generic_can_implement(d, w); !why.empty()) FP4MOE_FAIL("Generic GEMM: {}", why);
  FP4MOE_CHECK(a.x && a.expert_offsets && a.y && w.packed && w.scales,
               "Generic GEMM: null x / expert_offsets / y / weight pointer");
  FP4MOE_CHECK(aligned(a.x, 16), "Generic GEMM: x must be 16-byte aligned");
  FP4MOE_CHECK(aligned(w.packed, 8), "Generic GEMM: packed weights must be 8-byte aligned");
  FP4MOE_CHECK(aligned(a.y, 2), "Generic GEMM: y must be 2-byte aligned");
  FP4MOE_CHECK(d.epilogue != Epilogue::RowScale || a.row_scale,
               "Generic GEMM: Epilogue::RowScale needs row_scale");
  FP4MOE_CHECK(a.m_total >= 0 && (d.max_tokens == 0 || a.m_total <= d.max_tokens),
               "Generic GEMM: m_total={} exceeds max_tokens={}", a.m_total, d.max_tokens);
  if (a.m_total == 0) return;

  linear_fp4::GenericParams p;
  p.x = a.x;
  p.offsets = a.expert_offsets;
  p.packed = w.packed;
  p.scales = w.scales;
  p.global = w.global_scale;
  p.row_scale = a.row_scale;
  p.y = a.y;
  p.num_experts = d.num_experts;
  p.n = d.n;
  p.k = d.k;
  const bool silu = d.epilogue == Epilogue::SiluMul;
  p.n_out = silu ? d.n / 2 : d.n;
  p.epilogue = silu ? linear_fp4::kEpiSiluMul
                    : d.epilogue == Epilogue::RowScale ? linear_fp4::kEpiRowScale : linear_fp4::kEpiNone;
  p.mx = d.weight == WeightFormat::MXFP4;
  FP4MOE_CUDA_CHECK(linear_fp4::launch_generic_grouped_gemm(p, a.stream));
}

}  // namespace fp4moe::cuda
