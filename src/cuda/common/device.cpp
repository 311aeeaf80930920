#include "cuda/common/device.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda {

bool device_available() {
  static const bool available = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return false;
    }
    return n > 0;
  }();
  return available;
}

namespace {

DeviceInfo read_device(int ordinal) {
  cudaDeviceProp p{};
  FP4MOE_CUDA_CHECK(cudaGetDeviceProperties(&p, ordinal));
  DeviceInfo d;
  d.ordinal = ordinal;
  d.cc = p.major * 10 + p.minor;
  d.sm_count = p.multiProcessorCount;
  d.name = p.name;
  d.smem_per_block_optin = int64_t(p.sharedMemPerBlockOptin);
  d.smem_per_sm = int64_t(p.sharedMemPerMultiprocessor);
  d.smem_reserved_per_block = int64_t(p.reservedSharedMemPerBlock);
  d.regs_per_sm = p.regsPerMultiprocessor;
  d.regs_per_block = p.regsPerBlock;
  d.max_threads_per_block = p.maxThreadsPerBlock;
  d.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  d.max_blocks_per_sm = p.maxBlocksPerMultiProcessor;
  d.l2_bytes = p.l2CacheSize;
  FP4MOE_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  FP4MOE_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

struct DeviceTable {
  std::once_flag once[kMaxDevices];
  std::unique_ptr<DeviceInfo> info[kMaxDevices];
  std::atomic<const DeviceInfo*> ready[kMaxDevices] = {};  // published after the read
};

DeviceTable& table() {
  static DeviceTable t;
  return t;
}

}  // namespace

const DeviceInfo& device_info(int ordinal) {
  FP4MOE_CHECK(device_available(), "no CUDA device is available");
  int n = 0;
  FP4MOE_CUDA_CHECK(cudaGetDeviceCount(&n));
  FP4MOE_CHECK(ordinal >= 0 && ordinal < n && ordinal < kMaxDevices, "CUDA device {} does not exist ({} present)",
               ordinal, n);
  DeviceTable& t = table();
  std::call_once(t.once[ordinal], [&] {
    t.info[ordinal] = std::make_unique<DeviceInfo>(read_device(ordinal));
    t.ready[ordinal].store(t.info[ordinal].get(), std::memory_order_release);
  });
  return *t.info[ordinal];
}

int current_device_ordinal() {
  int d = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&d));
  FP4MOE_CHECK(d >= 0 && d < kMaxDevices, "CUDA device {} is past the {} this build tracks", d, kMaxDevices);
  return d;
}

const DeviceInfo& current_device() {
  const int d = current_device_ordinal();
  if (const DeviceInfo* i = table().ready[d].load(std::memory_order_acquire)) [[likely]] return *i;
  return device_info(d);
}

}  // namespace fp4moe::cuda
