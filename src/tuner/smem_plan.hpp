// Shared memory, term by term: a kernel's shared storage laid out the way a C++ struct
// with alignas() members is (each term starts at its alignment; the struct's size is a
// multiple of its largest alignment), so the total is what the kernel really asks for and
// every byte of padding is visible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe::tuner {

struct SmemTerm {
  std::string name;     // "A (FP4 weights)"
  std::string detail;   // "3 stages x 128 rows x 64 B"
  int64_t bytes = 0;    // the term itself
  int64_t align = 1;    // its start alignment
  int64_t offset = 0;   // where it starts
  int64_t pad = 0;      // padding inserted before it to reach `align`
};

class SmemPlan {
 public:
  // Appends a term at the next offset aligned to `align` (a power of two).
  void add(std::string name, int64_t bytes, int64_t align, std::string detail = {});
  // Rounds the running size up to `align` (the end of a struct whose alignment is `align`).
  void end_struct(std::string name, int64_t align);

  int64_t total() const { return end_; }          // bytes the kernel requests
  int64_t raw_bytes() const;                      // sum of the terms, no padding
  int64_t padding() const { return end_ - raw_bytes(); }
  const std::vector<SmemTerm>& terms() const { return terms_; }

  // One line per term plus the total, e.g.
  //   "  A (FP4 weights)   3 x 8,192 B        24,576 B  @ 0"
  std::string explain(const std::string& indent = "    ") const;

 private:
  std::vector<SmemTerm> terms_;
  int64_t end_ = 0;
};

constexpr int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fp4moe::tuner
