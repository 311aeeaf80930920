// Per-architecture limits, from the CUDA C++ Programming Guide's "Technical Specifications
// per Compute Capability" table and the PTX ISA's per-target instruction lists.
//   shared memory per SM / per block (opt-in):  8.0: 164 / 163 KB;  8.6, 8.9: 100 / 99 KB;
//   9.0, 10.0, 10.3: 228 / 227 KB;  12.0, 12.1: 100 / 99 KB.  The 1 KB difference is the
//   per-block reservation of the driver (CUTLASS's sm90/sm100/sm120_smem_capacity_bytes are
//   these opt-in numbers: 232,448 and 101,376).
//   resident threads per SM: 2048 (8.0, 9.0, 10.x); 1536 (8.6, 8.9, 12.x).
//   resident blocks per SM: 32 (8.0, 9.0, 10.x, 12.x), 16 (8.6), 24 (8.9).
//   registers: 64 K 32-bit per SM, 64 K per block, 255 per thread on all of them.
// SM counts are those of the named part when one part dominates (A100 SXM 108, H100 SXM /
// H200 132, B200 148), else 0 (read from the device when it is present).
#include <array>

#include "tuner/arch.hpp"

namespace fp4moe::tuner {
namespace {

constexpr int64_t kKB = 1024;

ArchInfo make(std::string name, int cc, std::string parts, int64_t smem_sm_kb, int threads_sm,
              int blocks_sm, int sm_count) {
  ArchInfo a;
  a.name = std::move(name);
  a.cc = cc;
  a.parts = std::move(parts);
  a.smem_per_sm = smem_sm_kb * kKB;
  a.smem_reserved_per_block = 1 * kKB;
  a.smem_per_block_optin = a.smem_per_sm - a.smem_reserved_per_block;
  a.max_threads_per_sm = threads_sm;
  a.max_blocks_per_sm = blocks_sm;
  a.sm_count = sm_count;
  a.cp_async = cc >= 80;
  a.mma_sync_bf16 = cc >= 80;
  a.fp8_mma = cc >= 89;
  a.tma = cc >= 90;
  a.clusters = cc >= 90;
  a.wgmma = cc == 90;
  a.tcgen05 = cc == 100 || cc == 103;
  a.block_scaled_mma = cc >= 100;
  return a;
}

const std::array<ArchInfo, 8>& table() {
  static const std::array<ArchInfo, 8> t = {
      make("sm_80", 80, "A100", 164, 2048, 32, 108),
      make("sm_86", 86, "A10 / A40 / RTX 30xx", 100, 1536, 16, 0),
      make("sm_89", 89, "L4 / L40S / RTX 40xx", 100, 1536, 24, 0),
      make("sm_90", 90, "H100 / H200", 228, 2048, 32, 132),
      make("sm_100", 100, "B200 / GB200", 228, 2048, 32, 148),
      make("sm_103", 103, "B300 / GB300", 228, 2048, 32, 0),
      make("sm_120", 120, "RTX 50xx / RTX PRO 6000 Blackwell", 100, 1536, 32, 0),
      make("sm_121", 121, "GB10 (DGX Spark)", 100, 1536, 32, 48),
  };
  return t;
}

}  // namespace

std::span<const ArchInfo> arch_table() { return table(); }

}  // namespace fp4moe::tuner
