// The dense linear op (see linear.hpp): the kernel choice, the upload, the call.
#include "cuda/linear/linear.hpp"

#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/staged_upload.hpp"

namespace fp4moe::cuda::linear {
namespace {

WeightFormat fp4_weight_format(cpu::LinearFormat f) {
  return f == cpu::LinearFormat::MXFP4 ? WeightFormat::MXFP4 : WeightFormat::NVFP4;
}

DenseFp4Kernel dense_kernel(LinearKernel k) {
  return k == LinearKernel::Fp4Sm90 ? DenseFp4Kernel::Sm90 : DenseFp4Kernel::Generic;
}

// The view as the dense FP4 GEMM takes it: one expert, view mode (the mmap'd bytes).
ExpertStack fp4_stack(const cpu::LinearView& v) {
  ExpertStack s;
  s.format = fp4_weight_format(v.format);
  s.num_experts = 1;
  s.n = v.n;
  s.k = v.k;
  ExpertStack::PartView p;
  p.packed = v.packed;
  p.scales = v.scales;
  p.global_scale = v.global_scale;
  s.views = {p};
  return s;
}

// The FP4 fallback's line: once per (n, k) per process.
void say_fallback_once(const std::string& name, const LinearDesc& d, const std::string& why) {
  static std::mutex mu;
  static std::set<std::pair<int64_t, int64_t>> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert({d.n, d.k}).second)
    log_info("linear {} [{} x {}] {}: dequantized to BF16 at load + cuBLASLt ({})", name, d.n, d.k,
             cpu::linear_format_name(d.format), why);
}

}  // namespace

const char* linear_kernel_name(LinearKernel k) {
  switch (k) {
    case LinearKernel::Fp4Sm90: return "fp4 sm90";
    case LinearKernel::Fp4Generic: return "fp4 generic";
    case LinearKernel::Bf16Cublaslt: return "bf16 cublaslt";
  }
  return "?";
}

std::string can_implement(LinearKernel kernel, const LinearDesc& d, int sm) {
  if (d.n <= 0 || d.k <= 0 || d.n >= (int64_t(1) << 31) || d.k >= (int64_t(1) << 31))
    return fmt::format("bad shape [{} x {}]", d.n, d.k);
  if (d.max_tokens < 1 || d.max_tokens >= (int64_t(1) << 31))
    return fmt::format("max_tokens = {} outside [1, 2^31)", d.max_tokens);
  if (kernel == LinearKernel::Bf16Cublaslt) return {};
  if (!(d.format == cpu::LinearFormat::NVFP4 || d.format == cpu::LinearFormat::MXFP4))
    return fmt::format("{} takes NVFP4 or MXFP4 weights, not {}", linear_kernel_name(kernel),
                       cpu::linear_format_name(d.format));
  if (d.bf16_only)
    return fmt::format("{} writes dense BF16 rows of the step's T only; the caller needs the BF16 form",
                       linear_kernel_name(kernel));
  return dense_fp4_can_implement(dense_kernel(kernel), fp4_weight_format(d.format), d.n, d.k, d.max_tokens, sm);
}

LinearChoice choose_linear_kernel(const LinearDesc& d, int sm) {
  if (std::string why = can_implement(LinearKernel::Bf16Cublaslt, d, sm); !why.empty())
    FP4MOE_FAIL("linear [{} x {}]: {}", d.n, d.k, why);
  LinearChoice c;
  switch (d.format) {
    case cpu::LinearFormat::BF16: return c;
    case cpu::LinearFormat::F32:
      c.converted = true;
      c.why = "no F32 kernel: rounded to BF16";
      return c;
    case cpu::LinearFormat::NVFP4:
    case cpu::LinearFormat::MXFP4: break;
  }
  if (d.bf16_only) {
    c.converted = true;
    c.why = "the caller needs the BF16 form";
    return c;
  }
  const std::string sm90 = can_implement(LinearKernel::Fp4Sm90, d, sm);
  if (sm90.empty()) {
    c.kernel = LinearKernel::Fp4Sm90;
    return c;
  }
  const std::string generic = can_implement(LinearKernel::Fp4Generic, d, sm);
  if (generic.empty()) {
    c.kernel = LinearKernel::Fp4Generic;
    c.why = "fp4 sm90: " + sm90;
    return c;
  }
  c.converted = true;
  c.why = fmt::format("no FP4 kernel takes it: fp4 sm90: {}; fp4 generic: {}", sm90, generic);
  return c;
}

std::vector<uint16_t> linear_to_bf16(const cpu::LinearView& v) {
  std::vector<uint16_t> out(size_t(v.n * v.k));
  if (v.format == cpu::LinearFormat::BF16) {
    std::memcpy(out.data(), v.data, out.size() * 2);
    return out;
  }
  std::vector<float> row(size_t(v.k));
  for (int64_t r = 0; r < v.n; ++r) {
    cpu::linear_row_cpu(v, r, row.data());
    for (int64_t i = 0; i < v.k; ++i) out[size_t(r * v.k + i)] = float_to_bf16(row[size_t(i)]);
  }
  return out;
}

Linear::Linear(const cpu::LinearView& w, const std::string& name, int64_t max_tokens, bool bf16_only,
               StagedUpload& staging)
    : n(w.n), k(w.k) {
  LinearDesc d;
  d.format = w.format;
  d.n = w.n;
  d.k = w.k;
  d.max_tokens = max_tokens;
  d.bf16_only = bf16_only;
  // The compute capability only matters to the FP4 kernels (a BF16 linear needs no device query).
  const int sm = w.is_fp4() && !bf16_only ? current_device().cc : 0;
  choice_ = choose_linear_kernel(d, sm);
  if (choice_.kernel != LinearKernel::Bf16Cublaslt) {
    if (choice_.kernel == LinearKernel::Fp4Generic)
      log_debug("linear {} [{} x {}]: fp4 generic ({})", name, w.n, w.k, choice_.why);
    try {
      fp4_ = std::make_unique<DenseFp4Gemm>(fp4_stack(w), dense_kernel(choice_.kernel), max_tokens, &staging);
      bytes_ = fp4_->weight_bytes();
      return;
    } catch (const Error& e) {  // the weight's bytes (e.g. MXFP4 scales past the sm90 layout's range)
      choice_ = {LinearKernel::Bf16Cublaslt, true, fmt::format("{} refused the weight: {}",
                                                               linear_kernel_name(choice_.kernel), e.what())};
    }
  }
  if (w.is_fp4() && !bf16_only) say_fallback_once(name, d, choice_.why);
  bf16_ = DeviceBuffer(size_t(w.n * w.k) * 2);
  if (w.format == cpu::LinearFormat::BF16) {
    staging.upload(bf16_.ptr(), w.data, bf16_.bytes());
  } else {
    const std::vector<uint16_t> h = linear_to_bf16(w);
    staging.upload(bf16_.ptr(), h.data(), h.size() * 2);
  }
  bytes_ = bf16_.bytes();
}

void Linear::run(const uint16_t* x, int T, void* y, bool y_f32, const LinearCtx& ctx, int64_t ldx, int64_t ldy) const {
  if (choice_.kernel == LinearKernel::Bf16Cublaslt) {
    FP4MOE_CHECK(bf16_.ptr() != nullptr, "linear [{} x {}]: not uploaded", n, k);
    ctx.blas->gemm(bf16(), int(n), int(k), x, ldx, T, y, y_f32, ldy, ctx.stream);
    return;
  }
  FP4MOE_CHECK(!y_f32 && (ldx == 0 || ldx == k) && (ldy == 0 || ldy == n),
               "linear [{} x {}] on {}: dense BF16 rows in and out only", n, k, linear_kernel_name(choice_.kernel));
  fp4_->run(x, ctx.offsets, y, T, ctx.fp4_workspace, ctx.stream);
}

std::string Linear::describe() const {
  if (fp4_) return fmt::format("fp4 {}", fp4_->describe());
  return choice_.converted ? std::string("bf16 cublaslt (converted to BF16 at load)") : std::string("bf16 cublaslt");
}

}  // namespace fp4moe::cuda::linear
