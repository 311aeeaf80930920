// cuda/common: the device buffer (sizes checked before any copy, moves own the allocation), the
// per-device properties (read once, the same as the runtime's), and DeviceOnce.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/device_buffer.hpp"
#include "gpu_test.hpp"

namespace fp4moe::cuda {
namespace {

TEST(DeviceBuffer, SizesAreCheckedBeforeAnyCopy) {  // no GPU needed: nothing is allocated
  DeviceBuffer empty;
  EXPECT_EQ(empty.ptr(), nullptr);
  EXPECT_EQ(empty.bytes(), 0u);
  EXPECT_THROW(empty.upload(std::vector<float>{1.0f}), Error);
  EXPECT_THROW(empty.download<float>(1), Error);
  EXPECT_TRUE(empty.download<float>().empty());
}

TEST(DeviceBuffer, RoundTripAndMove) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::vector<int> h = {1, 2, 3, 4, 5};
  DeviceBuffer a = DeviceBuffer::from(h);
  EXPECT_EQ(a.bytes(), h.size() * sizeof(int));
  EXPECT_EQ(a.download<int>(), h);
  void* p = a.ptr();
  DeviceBuffer b = std::move(a);
  EXPECT_EQ(a.ptr(), nullptr);
  EXPECT_EQ(b.ptr(), p);
  b.upload(std::vector<int>{9, 8}, 3 * sizeof(int));
  EXPECT_EQ(b.download<int>(), (std::vector<int>{1, 2, 3, 9, 8}));
  EXPECT_THROW(b.upload(std::vector<int>{1, 2}, 4 * sizeof(int)), Error);
}

TEST(DeviceInfo, MatchesTheRuntimeAndIsReadOnce) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const DeviceInfo& d = current_device();
  int sms = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d.ordinal), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.ordinal), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d.ordinal), cudaSuccess);
  EXPECT_EQ(d.sm_count, sms);
  EXPECT_EQ(d.cc, major * 10 + minor);
  EXPECT_FALSE(d.name.empty());
  EXPECT_EQ(&device_info(d.ordinal), &d) << "one record per device";
  EXPECT_THROW(device_info(kMaxDevices + 1), Error);
  int runs = 0;
  DeviceOnce once;
  for (int i = 0; i < 3; ++i) once([&] { ++runs; });
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace fp4moe::cuda
