#include "tuner/arch.hpp"

#include <cctype>
#include <string>

#include "core/error.hpp"
#include "tuner/moe_gemm_family.hpp"  // arch_of_device

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
  DeviceProps d;
  d.cc = p.cc;
  d.name = p.name;
  d.smem_per_block_optin = p.smem_per_block_optin;
  d.smem_per_sm = p.smem_per_sm;
  d.smem_reserved_per_block = p.smem_reserved_per_block;
  d.regs_per_sm = p.regs_per_sm;
  d.regs_per_block = p.regs_per_block;
  d.max_threads_per_block = p.max_threads_per_block;
  d.max_threads_per_sm = p.max_threads_per_sm;
  d.max_blocks_per_sm = p.max_blocks_per_sm;
  d.sm_count = p.sm_count;
  d.l2_bytes = p.l2_bytes;
  d.driver_version = p.driver_version;
  d.runtime_version = p.runtime_version;
  return arch_of_device(d);
}

#else

bool have_device() { return false; }

ArchInfo device_arch(int) { FP4MOE_FAIL("this fp4moe was built without CUDA: no device to read"); }

#endif

}  // namespace fp4moe::tuner
