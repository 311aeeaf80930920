// W4A4 with the checkpoint's static input_scale (moe/expert_gemm.hpp): the activations' NVFP4
// global comes from ExpertStack::input_scale when it is set, else from their amax on the device
// per call (amax / 2688). A static scale equal to that derived one gives the same output bit
// for bit; another static scale (x 3: not a power of two, so the E4M3 block scales round
// differently) changes it. Needs a GPU with a W4A4 path (sm90 emulation or sm1xx) built into this
// binary: skipped on any other device, and any error on one that has the path fails the test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/device_buffer.hpp"
#include "gpu_test.hpp"
#include "moe/expert_gemm.hpp"
#include "random_fp4.hpp"
#include "tuner/sm1xx_build.hpp"

namespace fp4moe {
namespace {

TEST(ExpertGemmW4A4, StaticInputScaleIsTheActivationsGlobal) {
  FP4MOE_SKIP_WITHOUT_GPU();
  // The W4A4 paths: the sm90 emulation (sm_90 with 90a built) and sm1xx (sm_100 / sm_120 with
  // their "a" arch built). Anywhere else the layer refuses W4A4: the wrong arch, a skip.
  const int cc = cuda::current_device().cc;
  if (!((cc == 90 || cc == 100 || cc == 120) && test::built_for_arch(cc)))
    GTEST_SKIP() << "no W4A4 GEMM path for sm_" << cc << " in this build (" << tuner::compiled_cuda_archs_text() << ")";
  constexpr int64_t kN = 256, kK = 512, kTokens = 24;
  constexpr int kRowsPerToken = 2;
  ExpertStack w = test::random_stack(WeightFormat::NVFP4, 8, kN, kK, 11);
  const std::vector<int32_t> counts = {10, 0, 6, 12, 4, 0, 9, 7};  // 48 = tokens x rows per token
  std::vector<int32_t> offsets = {0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t M = offsets.back();
  ASSERT_EQ(M, kTokens * kRowsPerToken);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<uint16_t> x(size_t(M * kK));
  float amax = 0.0f;
  for (uint16_t& v : x) {
    v = float_to_bf16(nd(rng));
    amax = std::max(amax, std::fabs(bf16_to_float(v)));
  }
  const float derived = amax / 2688.0f;  // the device's amax / (6 * 448), one IEEE division

  const cuda::DeviceBuffer dx = cuda::DeviceBuffer::from(x), doff = cuda::DeviceBuffer::from(offsets);
  auto run = [&](float input_scale) {
    w.input_scale = input_scale;
    const auto g = moe::upload_expert_gemm({&w}, cuda::Epilogue::None, 32, kRowsPerToken, 0, MoeGemmPath::Auto, true);
    cuda::DeviceBuffer dy(size_t(M * kN) * 2), ws(std::max<size_t>(g->workspace_bytes(), 16));
    FP4MOE_CUDA_CHECK(cudaMemset(dy.ptr(), 0xFF, dy.bytes()));  // poisoned
    g->run(cuda::Epilogue::None, dx.ptr(), doff.as<int32_t>(), nullptr, dy.ptr(), kTokens, ws.ptr(), nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    return dy.download<uint16_t>(size_t(M * kN));
  };
  const std::vector<uint16_t> per_call = run(0.0f);  // an fp4moe::Error here fails the test
  for (size_t i = 0; i < per_call.size(); ++i)
    ASSERT_TRUE(std::isfinite(bf16_to_float(per_call[i]))) << "element " << i << " not written";
  EXPECT_EQ(run(derived), per_call) << "static input_scale " << derived << " = the derived global";
  const std::vector<uint16_t> other = run(3.0f * derived);
  EXPECT_NE(other, per_call) << "a static input_scale of 3x the derived one changed nothing: it is not used";
}

}  // namespace
}  // namespace fp4moe
