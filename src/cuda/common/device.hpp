// The one place that asks a CUDA device what it is: per-device state, read once per device
// (the first time a device is asked for) and kept for the process, ready for several GPUs.
// Launchers read the SM count from here (a cudaGetDevice and an array lookup, no driver
// query), and per-device one-time work (cudaFuncSetAttribute) goes through DeviceOnce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace fp4moe::cuda {

// True when a CUDA device is usable (tests skip otherwise).
bool device_available();

struct DeviceInfo {
  int ordinal = 0;
  int cc = 0;                        // 10 * major + minor: 90
  int sm_count = 0;
  std::string name;                  // "NVIDIA H200"
  int64_t smem_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  int64_t smem_per_sm = 0;
  int64_t smem_reserved_per_block = 0;
  int regs_per_sm = 0, regs_per_block = 0;
  int max_threads_per_block = 0, max_threads_per_sm = 0, max_blocks_per_sm = 0;
  int64_t l2_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

inline constexpr int kMaxDevices = 64;

// The device's properties (read on first use; throws fp4moe::Error for a bad ordinal).
const DeviceInfo& device_info(int ordinal);
// The current device's (cudaGetDevice).
const DeviceInfo& current_device();
int current_device_ordinal();

// Runs `fn` once per device, the first time it is called with that device current: e.g. a
// kernel's cudaFuncSetAttribute(MaxDynamicSharedMemorySize), which is per device.
class DeviceOnce {
 public:
  template <typename Fn>
  void operator()(Fn&& fn) {
    const int d = current_device_ordinal();
    std::call_once(flags_[d], fn);
  }

 private:
  std::once_flag flags_[kMaxDevices];
};

}  // namespace fp4moe::cuda
