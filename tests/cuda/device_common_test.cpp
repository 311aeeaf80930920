// cuda/common: the device buffer (sizes checked before any copy, moves own the allocation), the
// per-device properties (read once, the same as the runtime's), DeviceOnce, and the benches'
// floor kernel.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "cuda/bench/bench_util.hpp"
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

TEST(FloorKernel, WritesExactlyItsBytesAndLeavesItsSpansAlone) {
  FP4MOE_SKIP_WITHOUT_GPU();
  std::vector<uint32_t> src(4096), poison(2048, 0xDEADBEEFu);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint32_t(i * 2654435761u);
  DeviceBuffer a = DeviceBuffer::from(src), dst = DeviceBuffer::from(poison);
  bench::move_bytes({{a.ptr(), 16000}, {a.as<uint32_t>() + 4000, 96}}, dst.ptr(), 4096, nullptr);
  bench::launch_empty(nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(a.download<uint32_t>(), src);
  const std::vector<uint32_t> d = dst.download<uint32_t>();
  for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(d[i], i < 1024 ? 0u : 0xDEADBEEFu) << "word " << i;
}

TEST(FloorKernel, GatherReadsOnlyAndRefusesBadPools) {
  alignas(16) static uint8_t h[256];
  EXPECT_THROW(bench::gather_pages({{h, 24}}, nullptr, 0, nullptr), Error);       // page bytes not a multiple of 16
  EXPECT_THROW(bench::gather_pages({{h + 8, 32}}, nullptr, 0, nullptr), Error);   // misaligned pool
  EXPECT_THROW(bench::gather_pages({{h, 32}}, nullptr, 3, nullptr), Error);       // pages and no index
  EXPECT_THROW(bench::gather_pages({{h, 16}, {h, 16}, {h, 16}}, nullptr, 0, nullptr), Error);
  EXPECT_NO_THROW(bench::gather_pages({{h, 32}}, nullptr, 0, nullptr));           // nothing to read: no launch
  FP4MOE_SKIP_WITHOUT_GPU();
  std::vector<uint32_t> pool(64 * 36);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = uint32_t(i);
  DeviceBuffer a = DeviceBuffer::from(pool), idx = DeviceBuffer::from(std::vector<int32_t>{5, 0, 63, 17, 5});
  bench::gather_pages({{a.ptr(), 128}, {a.ptr(), 144}}, idx.as<int32_t>(), 5, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(a.download<uint32_t>(), pool);
}

TEST(FloorKernel, RefusesMisalignedSpansAndAMissingDestination) {  // no GPU needed: refused before any launch
  alignas(16) static uint8_t a[256];
  EXPECT_THROW(bench::move_bytes({{a + 4, 64}}, nullptr, 0, nullptr), Error);
  EXPECT_THROW(bench::move_bytes({{a, 64}}, nullptr, 64, nullptr), Error);
  EXPECT_THROW(bench::move_bytes({{a, 64}}, a + 8, 64, nullptr), Error);
  EXPECT_THROW(bench::move_bytes({{a, 1}, {a, 1}, {a, 1}, {a, 1}, {a, 1}}, nullptr, 0, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe::cuda
