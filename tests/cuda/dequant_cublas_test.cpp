// GemmKernel::DequantCublas (both modes) against the CPU reference
// (tests/cuda/linear_fp4_gemm_check.hpp), and its host-side validation.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/dequant_cublas.hpp"
#include "gpu_test.hpp"
#include "linear_fp4_gemm_check.hpp"

namespace fp4moe::test {
namespace {

using cuda::DequantCublasOptions;

GemmRunner runner(DequantCublasOptions opt, bool pass_host_offsets) {
  return [opt, pass_host_offsets](const MoeGemmDesc& d, const LinearFp4Weights& w, const MoeGemmArgs& a,
                                  std::span<const int32_t> off) {
    cuda::DequantCublasGemm g(d, opt);
    g.run(w, a, pass_host_offsets ? off : std::span<const int32_t>{});
  };
}

TEST(DequantCublasValidation, RejectsBadShapesWithAReason) {
  MoeGemmDesc d;
  d.num_experts = 4;
  d.n = 64;
  d.k = 64;
  d.max_tokens = 16;
  EXPECT_EQ(cuda::dequant_cublas_can_implement(d, {}), "");
  MoeGemmDesc b = d;
  b.k = 40;
  EXPECT_NE(cuda::dequant_cublas_can_implement(b, {}).find("multiple of"), std::string::npos);
  b = d;
  b.weight = WeightFormat::MXFP4;
  b.k = 48;
  EXPECT_NE(cuda::dequant_cublas_can_implement(b, {}).find("multiple of"), std::string::npos);
  b = d;
  b.n = 60;
  EXPECT_NE(cuda::dequant_cublas_can_implement(b, {}).find("multiple of 8"), std::string::npos);
  b = d;
  b.epilogue = cuda::Epilogue::SiluMul;
  b.max_tokens = 0;
  EXPECT_NE(cuda::dequant_cublas_can_implement(b, {}).find("max_tokens"), std::string::npos);
  b = d;
  b.act = cuda::ActFormat::NVFP4_EMULATED;
  EXPECT_NE(cuda::dequant_cublas_can_implement(b, {}), "");
  LinearFp4Weights w;
  w.format = WeightFormat::NVFP4;
  w.num_experts = 4;
  w.n = 64;
  w.k = 128;
  EXPECT_NE(cuda::dequant_cublas_can_implement(d, w).find("weights are"), std::string::npos);
  b = d;
  b.n = 60;
  EXPECT_THROW(cuda::DequantCublasGemm g(b), Error);  // throws before allocating anything
}

TEST(DequantCublas, CublasLtMatchesCpuReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (const GemmCase& c : standard_cases(true)) {
    const double rel = check_grouped_gemm(c, runner({}, true));
    std::printf("  cublaslt %-48s rel %.2e\n", case_name(c).c_str(), rel);
  }
}

TEST(DequantCublas, GroupedBatchedMatchesCpuReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  DequantCublasOptions opt;
  opt.mode = DequantCublasOptions::Mode::GroupedBatched;
  for (const GemmCase& c : standard_cases(false)) check_grouped_gemm(c, runner(opt, true));
}

TEST(DequantCublas, ChunkedSlotsAndDeviceOffsets) {
  FP4MOE_SKIP_WITHOUT_GPU();
  // Few slots -> several dequantize + GEMM chunks; no host offsets -> the D2H copy path.
  DequantCublasOptions opt;
  opt.max_dequant_bytes = size_t(256) * 256 * 2 * 3;  // 3 experts per chunk
  for (const GemmCase& c : standard_cases(false)) {
    check_grouped_gemm(c, runner(opt, false));
    opt.mode = opt.mode == DequantCublasOptions::Mode::CublasLt ? DequantCublasOptions::Mode::GroupedBatched
                                                                : DequantCublasOptions::Mode::CublasLt;
  }
}

}  // namespace
}  // namespace fp4moe::test
