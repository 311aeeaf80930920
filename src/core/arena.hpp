// Arena: bump allocation of host scratch memory for one step, released all at once.
//
// Memory comes in blocks (at least `block_bytes`, or the request if larger) that are kept
// and reused after a reset, so a steady-state step allocates nothing. Every allocation is
// 64-byte aligned. Not thread-safe: one arena per thread of control.
//
//   Arena arena;
//   { Arena::Scope scope(arena); float* x = arena.alloc<float>(n); ... }  // freed here
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace fp4moe {

class Arena {
 public:
  explicit Arena(size_t block_bytes = size_t(64) << 20) : block_bytes_(block_bytes) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc_bytes(size_t n);
  template <typename T>
  T* alloc(size_t count) {
    return static_cast<T*>(alloc_bytes(count * sizeof(T)));
  }

  struct Mark {
    size_t block = 0, offset = 0;
  };
  Mark mark() const { return {current_, offset_}; }
  void reset(Mark m) { current_ = m.block, offset_ = m.offset; }
  void reset() { reset(Mark{}); }

  size_t reserved_bytes() const;  // sum of the blocks held
  size_t peak_bytes() const { return peak_; }

  class Scope {
   public:
    explicit Scope(Arena& a) : a_(a), m_(a.mark()) {}
    ~Scope() { a_.reset(m_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Arena& a_;
    Mark m_;
  };

 private:
  struct Block {
    std::unique_ptr<std::byte[]> mem;
    size_t size = 0;
  };
  size_t block_bytes_;
  std::vector<Block> blocks_;
  size_t current_ = 0, offset_ = 0;  // bump position: block index, offset within it
  size_t peak_ = 0;
};

}  // namespace fp4moe
