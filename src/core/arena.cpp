#include "core/arena.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4moe {

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t x) { return (x + kAlign - 1) & ~(kAlign - 1); }
}  // namespace

void* Arena::alloc_bytes(size_t n) {
  n = align_up(std::max<size_t>(n, 1));
  while (current_ < blocks_.size()) {
    Block& b = blocks_[current_];
    const size_t start = align_up(reinterpret_cast<uintptr_t>(b.mem.get()) + offset_) -
                         reinterpret_cast<uintptr_t>(b.mem.get());
    if (start + n <= b.size) {
      offset_ = start + n;
      size_t used = offset_;
      for (size_t i = 0; i < current_; ++i) used += blocks_[i].size;
      peak_ = std::max(peak_, used);
      return b.mem.get() + start;
    }
    ++current_;
    offset_ = 0;
  }
  const size_t size = std::max(block_bytes_, n + kAlign);
  Block b;
  b.mem.reset(new (std::nothrow) std::byte[size]);
  FP4MOE_CHECK(b.mem != nullptr, "out of memory: scratch arena block of {} bytes", size);
  b.size = size;
  blocks_.push_back(std::move(b));
  current_ = blocks_.size() - 1;
  offset_ = 0;
  return alloc_bytes(n);
}

size_t Arena::reserved_bytes() const {
  size_t s = 0;
  for (const Block& b : blocks_) s += b.size;
  return s;
}

}  // namespace fp4moe
