// The MoE layer's GEMM path follows the device's arch (moe/expert_gemm.hpp, Auto): on the GPU
// present, the path it uploads for is the family of tuner::select_moe_gemm_family for that
// device, and on an sm_90 GPU of a build with sm_90a it is the sm90 kernels. Needs a GPU.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/common/device.hpp"
#include "gpu_test.hpp"
#include "moe/expert_gemm.hpp"
#include "random_fp4.hpp"
#include "tuner/moe_gemm_family.hpp"

namespace fp4moe {
namespace {

TEST(ExpertGemmPath, AutoUploadsForTheFamilyOfTheDevicesArch) {
  FP4MOE_SKIP_WITHOUT_GPU();
  unsetenv("FP4MOE_MOE_GEMM");  // Auto must decide
  const ExpertStack w = test::random_stack(WeightFormat::NVFP4, 8, 256, 512, 7);
  tuner::GemmProblem p;
  p.num_experts = 8;
  p.n = 256;
  p.k = 512;
  p.top_k = 2;
  p.weight = WeightFormat::NVFP4;
  p.epilogue = cuda::Epilogue::SiluMul;
  const tuner::ArchInfo arch = tuner::device_arch(cuda::current_device_ordinal());
  const tuner::FamilyChoice want = tuner::select_moe_gemm_family(arch, p, tuner::compiled_cuda_archs());
  if (want.family == tuner::MoeGemmFamily::None) {
    try {
      (void)moe::upload_expert_gemm({&w}, cuda::Epilogue::SiluMul, 16, 2);
      FAIL() << "uploaded on a device the binary has no code for";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want.why), std::string::npos) << e.what();
    }
    return;
  }
  const auto g = moe::upload_expert_gemm({&w}, cuda::Epilogue::SiluMul, 16, 2);
  const std::string d = g->describe();
  switch (want.family) {
    case tuner::MoeGemmFamily::Sm90: EXPECT_EQ(d.rfind("sm90", 0), 0u) << d; break;
    case tuner::MoeGemmFamily::Sm1xx: EXPECT_NE(d.find("sm1xx"), std::string::npos) << d; break;
    default: EXPECT_EQ(d.rfind("generic", 0), 0u) << d; break;
  }
#ifdef FP4MOE_HAVE_SM90
  if (arch.cc == 90) {  // the H200: the sm_90a kernels, as before the table existed
    EXPECT_EQ(want.family, tuner::MoeGemmFamily::Sm90) << want.why;
    EXPECT_EQ(d.rfind("sm90", 0), 0u) << d;
  }
#endif
}

}  // namespace
}  // namespace fp4moe
