// GemmKernel::Generic against the CPU reference (tests/cuda/linear_fp4_gemm_check.hpp), and
// its input validation (host side, runs without a GPU).
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "gpu_test.hpp"
#include "linear_fp4_gemm_check.hpp"

namespace fp4moe::test {
namespace {

void run_generic(const MoeGemmDesc& d, const LinearFp4Weights& w, const MoeGemmArgs& a, std::span<const int32_t>) {
  cuda::run_generic_grouped_gemm(d, w, a);
}

MoeGemmDesc desc(WeightFormat f, int n, int k, Epilogue e = Epilogue::None) {
  MoeGemmDesc d;
  d.num_experts = 4;
  d.n = n;
  d.k = k;
  d.max_tokens = 64;
  d.weight = f;
  d.epilogue = e;
  return d;
}

LinearFp4Weights weights_for(const MoeGemmDesc& d) {
  LinearFp4Weights w;
  w.format = d.weight;
  w.num_experts = d.num_experts;
  w.n = d.n;
  w.k = d.k;
  return w;
}

TEST(GenericGemmValidation, RejectsBadShapesWithAReason) {
  EXPECT_EQ(cuda::generic_can_implement(desc(WeightFormat::NVFP4, 64, 48), weights_for(desc(WeightFormat::NVFP4, 64, 48))), "");
  auto why = [](MoeGemmDesc d) { return cuda::generic_can_implement(d, weights_for(d)); };
  EXPECT_NE(why(desc(WeightFormat::NVFP4, 64, 40)).find("multiple of"), std::string::npos);
  EXPECT_NE(why(desc(WeightFormat::MXFP4, 64, 48)).find("multiple of"), std::string::npos);
  EXPECT_NE(why(desc(WeightFormat::NVFP4, 65, 64, Epilogue::SiluMul)).find("even N"), std::string::npos);
  EXPECT_NE(why(desc(WeightFormat::BF16, 64, 64)), "");
  MoeGemmDesc w4a4 = desc(WeightFormat::NVFP4, 64, 64);
  w4a4.act = cuda::ActFormat::NVFP4_EMULATED;
  EXPECT_NE(why(w4a4), "");
  // Weights that do not match the descriptor.
  MoeGemmDesc d = desc(WeightFormat::NVFP4, 64, 64);
  LinearFp4Weights w = weights_for(d);
  w.k = 128;
  EXPECT_NE(cuda::generic_can_implement(d, w).find("weights are"), std::string::npos);
}

TEST(GenericGemmValidation, RunThrowsBeforeLaunching) {
  MoeGemmDesc d = desc(WeightFormat::NVFP4, 64, 64);
  LinearFp4Weights w = weights_for(d);
  w.packed = reinterpret_cast<const uint8_t*>(uintptr_t(0x1000));
  w.scales = reinterpret_cast<const uint8_t*>(uintptr_t(0x2000));
  MoeGemmArgs a;
  a.x = reinterpret_cast<const void*>(uintptr_t(0x3008));  // not 16-byte aligned
  a.expert_offsets = reinterpret_cast<const int32_t*>(uintptr_t(0x4000));
  a.y = reinterpret_cast<void*>(uintptr_t(0x5000));
  a.m_total = 8;
  EXPECT_THROW(cuda::run_generic_grouped_gemm(d, w, a), Error);
  a.x = reinterpret_cast<const void*>(uintptr_t(0x3000));
  w.packed = reinterpret_cast<const uint8_t*>(uintptr_t(0x1004));  // not 8-byte aligned
  EXPECT_THROW(cuda::run_generic_grouped_gemm(d, w, a), Error);
  w.packed = reinterpret_cast<const uint8_t*>(uintptr_t(0x1000));
  a.m_total = 65;  // > max_tokens
  EXPECT_THROW(cuda::run_generic_grouped_gemm(d, w, a), Error);
  a.m_total = 8;
  d.epilogue = Epilogue::RowScale;  // without row_scale
  EXPECT_THROW(cuda::run_generic_grouped_gemm(d, w, a), Error);
  d = desc(WeightFormat::NVFP4, 64, 40);  // K not a multiple of 16
  EXPECT_THROW(cuda::run_generic_grouped_gemm(d, weights_for(d), a), Error);
  try {
    cuda::run_generic_grouped_gemm(d, weights_for(d), a);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K=40"), std::string::npos) << e.what();
  }
}

TEST(GenericGemm, MatchesCpuReference) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (const GemmCase& c : standard_cases(true)) {
    const double rel = check_grouped_gemm(c, run_generic);
    std::printf("  generic  %-48s rel %.2e\n", case_name(c).c_str(), rel);
  }
}

// No host synchronisation inside: the launch is capturable, and a replay writes exactly what
// the eager launch wrote (bit for bit); the replayed output is then checked against the CPU.
TEST(GenericGemm, GraphCaptureMatchesEager) {
  FP4MOE_SKIP_WITHOUT_GPU();
  GemmCase c{WeightFormat::NVFP4, 256, 256, Epilogue::SiluMul, {3, 0, 70, 1}, 0, 11};
  check_grouped_gemm(c, [](const MoeGemmDesc& d, const LinearFp4Weights& w, const MoeGemmArgs& a,
                           std::span<const int32_t> off) {
    const size_t y_bytes = size_t(off.back()) * size_t(d.n / 2) * 2;
    cudaStream_t s;
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    MoeGemmArgs as = a;
    as.stream = s;
    cuda::run_generic_grouped_gemm(d, w, as);  // eager
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<uint8_t> eager(y_bytes), replay(y_bytes);
    FP4MOE_CUDA_CHECK(cudaMemcpy(eager.data(), a.y, y_bytes, cudaMemcpyDeviceToHost));
    FP4MOE_CUDA_CHECK(cudaMemset(a.y, 0xFF, y_bytes));  // poison again
    cudaGraph_t g;
    cudaGraphExec_t ge;
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cuda::run_generic_grouped_gemm(d, w, as);
    FP4MOE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    FP4MOE_CUDA_CHECK(cudaGraphLaunch(ge, s));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    FP4MOE_CUDA_CHECK(cudaMemcpy(replay.data(), a.y, y_bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(replay, eager) << "graph replay differs from the eager launch";
  });
}

}  // namespace
}  // namespace fp4moe::test
