// Whether this binary was built for a Blackwell arch (CMAKE_CUDA_ARCHITECTURES holds 100a /
// 120a): the one reason a test of the sm1xx kernels, facts or tactics may skip without
// running a kernel. A build that targets the arch and still has an empty kernel / facts
// registry is a broken build: those tests fail then (FP4MOE_SKIP_UNLESS_BUILT_FOR, then an
// ASSERT on the registry). Not a GPU skip (no "-gpu" label): these tests need no device.
#pragma once

#include <algorithm>

#include <gtest/gtest.h>

#include "tuner/moe_gemm_family.hpp"

namespace fp4moe::test {
inline bool built_for_arch(int cc) {
  const auto archs = ::fp4moe::tuner::compiled_cuda_archs();
  return std::any_of(archs.begin(), archs.end(), [&](const ::fp4moe::tuner::CompiledArch& a) {
    return a.cc == cc && a.arch_specific && a.sass && a.ptx;  // "100a", as src/cuda/CMakeLists.txt matches it
  });
}
inline bool built_for_blackwell() { return built_for_arch(100) || built_for_arch(120); }
}  // namespace fp4moe::test

#define FP4MOE_SKIP_UNLESS_BUILT_FOR(cc)                                                          \
  do {                                                                                            \
    if (!::fp4moe::test::built_for_arch(cc))                                                      \
      GTEST_SKIP() << "this build has no sm_" << (cc) << "a (CMAKE_CUDA_ARCHITECTURES: '"         \
                   << ::fp4moe::tuner::compiled_cuda_archs_text() << "')";                        \
  } while (0)
#define FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL()                                                  \
  do {                                                                                            \
    if (!::fp4moe::test::built_for_blackwell())                                                   \
      GTEST_SKIP() << "this build has neither sm_100a nor sm_120a (CMAKE_CUDA_ARCHITECTURES: '"   \
                   << ::fp4moe::tuner::compiled_cuda_archs_text() << "')";                        \
  } while (0)
