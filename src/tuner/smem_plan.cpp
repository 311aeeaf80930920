#include "tuner/smem_plan.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "tuner/arch.hpp"

namespace fp4moe::tuner {

void SmemPlan::add(std::string name, int64_t bytes, int64_t align, std::string detail) {
  FP4MOE_CHECK(align > 0 && (align & (align - 1)) == 0, "alignment {} is not a power of two", align);
  FP4MOE_CHECK(bytes >= 0, "negative shared memory term {}", name);
  SmemTerm t;
  t.name = std::move(name);
  t.detail = std::move(detail);
  t.bytes = bytes;
  t.align = align;
  t.offset = align_up(end_, align);
  t.pad = t.offset - end_;
  end_ = t.offset + bytes;
  terms_.push_back(std::move(t));
}

void SmemPlan::end_struct(std::string name, int64_t align) {
  add(std::move(name), 0, align, fmt::format("end of a {} B aligned struct", align));
}

int64_t SmemPlan::raw_bytes() const {
  int64_t s = 0;
  for (const SmemTerm& t : terms_) s += t.bytes;
  return s;
}

std::string SmemPlan::explain(const std::string& indent) const {
  std::string out;
  for (const SmemTerm& t : terms_) {
    if (t.bytes == 0 && t.pad == 0) continue;  // a struct end that needed no padding
    if (t.pad > 0)
      out += fmt::format("{}{:<34} {:>9} B   (to a {} B boundary)\n", indent, "  + alignment padding",
                         with_commas(t.pad), t.align);
    if (t.bytes > 0)
      out += fmt::format("{}{:<34} {:>9} B   {}\n", indent, t.name, with_commas(t.bytes), t.detail);
  }
  out += fmt::format("{}{:<34} {:>9} B   ({} B of terms + {} B of alignment padding)\n", indent, "= total",
                     with_commas(total()), with_commas(raw_bytes()), with_commas(padding()));
  return out;
}

}  // namespace fp4moe::tuner
