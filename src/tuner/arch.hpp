// The architecture model: the per-SM and per-block limits a tactic's feasibility is judged
// against, and which instruction families exist. From the table (arch_table.cpp) for any
// architecture, or read from the device (cuda/common/device.hpp) when a GPU is present.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace fp4moe::tuner {

struct ArchInfo {
  std::string name;          // "sm_90"
  int cc = 0;                // 10 * major + minor: 90
  std::string parts;         // "H100 / H200", for messages

  // Shared memory. A block may use up to smem_per_block_optin bytes of dynamic shared memory
  // after cudaFuncSetAttribute(MaxDynamicSharedMemorySize); the driver reserves
  // smem_reserved_per_block more per resident block out of smem_per_sm.
  int64_t smem_per_block_optin = 0;   // sm_90: 232,448 B (227 KB)
  int64_t smem_per_sm = 0;            // sm_90: 233,472 B (228 KB)
  int64_t smem_reserved_per_block = 0;
  // 128B-swizzled tiles (TMA SWIZZLE_128B, wgmma/UMMA SW128 descriptors) repeat every
  // 8 rows x 128 B: each swizzled stage must start on a 1024 B boundary.
  int64_t swizzle_align = 1024;

  // Registers and threads.
  int regs_per_sm = 65536;
  int regs_per_block_max = 65536;
  int regs_per_thread_max = 255;
  int max_threads_per_block = 1024;
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
  int sm_count = 0;            // 0: varies by part (unknown from the table)
  int64_t l2_bytes = 0;        // 0: unknown

  // Instruction families.
  bool cp_async = false;          // sm_80+
  bool mma_sync_bf16 = false;     // sm_80+
  bool fp8_mma = false;           // sm_89+
  bool tma = false;               // cp.async.bulk.tensor: sm_90+
  bool clusters = false;          // thread block clusters: sm_90+
  bool wgmma = false;             // warpgroup MMA: sm_90a only
  bool tcgen05 = false;           // tensor memory + tcgen05.mma: sm_100a / sm_103a
  bool block_scaled_mma = false;  // native MXFP4/NVFP4 MMA (tcgen05 kind::mxf4nvf4 on sm_100/103,
                                  // mma.sync ...block_scale on sm_120/121)

  // Where the numbers came from: "table" or "device".
  std::string source = "table";
  // Device only.
  std::string gpu_name;
  int driver_version = 0;   // cudaDriverGetVersion: 13000 = 13.0
  int runtime_version = 0;  // cudaRuntimeGetVersion

  bool is_hopper() const { return cc == 90; }
  bool is_blackwell_dc() const { return cc == 100 || cc == 103; }
  bool is_blackwell_geforce() const { return cc == 120 || cc == 121; }
};

// Every architecture the table knows: sm_80, 86, 89, 90, 100, 103, 120, 121.
std::span<const ArchInfo> arch_table();

// Looks an architecture up by "sm_120", "sm120", "120", "12.0" or "sm_120a". Throws
// fp4moe::Error naming the known ones when it is not in the table.
const ArchInfo& arch_by_name(std::string_view name);

// True when a CUDA device is present (and this build has CUDA).
bool have_device();

// The device's architecture: the table row for its compute capability, with every field
// the runtime reports overwritten by the device's value (shared memory, registers, threads,
// SM count, L2, name, driver/runtime versions); source = "device". Throws without a device.
ArchInfo device_arch(int device = 0);

// "232,448"
std::string with_commas(int64_t v);

}  // namespace fp4moe::tuner
