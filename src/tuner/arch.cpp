#include "tuner/arch.hpp"

#include <cctype>
#include <string>

#include "core/error.hpp"

#ifdef FP4MOE_HAVE_CUDA
#include "cuda/common/device.hpp"
#endif

namespace fp4moe::tuner {

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

const ArchInfo& arch_by_name(std::string_view name) {
  // Accept "sm_120", "sm120", "sm_120a", "120", "12.0", "compute_120".
  std::string s(name);
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view prefix : {"sm_", "sm", "compute_"})
    if (s.rfind(prefix, 0) == 0) {
      s = s.substr(prefix.size());
      break;
    }
  if (!s.empty() && (s.back() == 'a' || s.back() == 'f')) s.pop_back();
  int cc = -1;
  if (auto dot = s.find('.'); dot != std::string::npos) {
    const std::string major = s.substr(0, dot), minor = s.substr(dot + 1);
    if (!major.empty() && minor.size() == 1 && std::isdigit(static_cast<unsigned char>(minor[0])) &&
        major.find_first_not_of("0123456789") == std::string::npos)
      cc = std::stoi(major) * 10 + (minor[0] - '0');
  } else if (!s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos) {
    cc = std::stoi(s);
  }
  std::string known;
  for (const ArchInfo& a : arch_table()) {
    if (a.cc == cc) return a;
    known += (known.empty() ? "" : ", ") + a.name;
  }
  FP4MOE_FAIL("unknown architecture '{}' (known: {})", name, known);
}

#ifdef FP4MOE_HAVE_CUDA

bool have_device() { return cuda::device_available(); }

ArchInfo device_arch(int device) {
  FP4MOE_CHECK(have_device(), "no CUDA device is available");
  const cuda::DeviceInfo& p = cuda::device_info(device);
  const int cc = p.cc;
  ArchInfo a;
  bool found = false;
  for (const ArchInfo& t : arch_table())
    if (t.cc == cc) {
      a = t;
      found = true;
    }
  if (!found) {  // an architecture the table does not know: take the device's numbers only
    a.name = "sm_" + std::to_string(cc);
    a.cc = cc;
    a.cp_async = a.mma_sync_bf16 = cc >= 80;
    a.fp8_mma = cc >= 89;
    a.tma = a.clusters = cc >= 90;
  }
  a.source = "device";
  a.gpu_name = p.name;
  a.smem_per_block_optin = p.smem_per_block_optin;
  a.smem_per_sm = p.smem_per_sm;
  a.smem_reserved_per_block = p.smem_reserved_per_block;
  a.regs_per_sm = p.regs_per_sm;
  a.regs_per_block_max = p.regs_per_block;
  a.max_threads_per_block = p.max_threads_per_block;
  a.max_threads_per_sm = p.max_threads_per_sm;
  a.max_blocks_per_sm = p.max_blocks_per_sm;
  a.sm_count = p.sm_count;
  a.l2_bytes = p.l2_bytes;
  a.driver_version = p.driver_version;
  a.runtime_version = p.runtime_version;
  return a;
}

#else

bool have_device() { return false; }

ArchInfo device_arch(int) { FP4MOE_FAIL("this fp4moe was built without CUDA: no device to read"); }

#endif

}  // namespace fp4moe::tuner
