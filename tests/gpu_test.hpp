// The one way a test says it needs a GPU: FP4MOE_SKIP_WITHOUT_GPU() skips it where no CUDA
// device is usable (CI) and marks its executable for `ctest -L gpu` (tests/CMakeLists.txt
// labels every test source that calls it). Works in CPU-only builds too (always skips there).
#pragma once

#include <gtest/gtest.h>

#if defined(FP4MOE_HAVE_CUDA)
#include "cuda/common/device.hpp"
namespace fp4moe::test {
inline bool gpu_available() { return ::fp4moe::cuda::device_available(); }
}  // namespace fp4moe::test
#else
namespace fp4moe::test {
inline bool gpu_available() { return false; }
}  // namespace fp4moe::test
#endif

#define FP4MOE_SKIP_WITHOUT_GPU()                                                \
  do {                                                                           \
    if (!::fp4moe::test::gpu_available()) GTEST_SKIP() << "no CUDA device";     \
  } while (0)
