#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/arena.hpp"
#include "core/bf16.hpp"
#include "core/tensor.hpp"

using namespace fp4moe;

TEST(Bfloat16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(float(bfloat16(1.0f + 1.0f / 256)), 1.0f);         // tie -> even
  EXPECT_EQ(float(bfloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(float(bfloat16(NAN))));
  EXPECT_EQ(bfloat16::from_bits(0xC000).to_float(), -2.0f);
}

TEST(TensorView, ContiguousStridesSliceIndexReshape) {
  std::vector<float> buf(2 * 3 * 4);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(i);
  const TensorView t = TensorView::of(buf.data(), {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_TRUE(t.is_contiguous());
  const TensorView s = t.slice(1, 1, 3);  // [2, 2, 4]
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.ptr<float>()[0], 4.0f);
  const TensorView r = t[1];  // [3, 4]
  EXPECT_EQ(r.ndim, 2);
  EXPECT_EQ(r.ptr<float>()[0], 12.0f);
  EXPECT_EQ(t.reshape({6, 4}).size(0), 6);
  EXPECT_THROW(t.reshape({5, 4}), Error);
  EXPECT_THROW(s.reshape({16}), Error);
  EXPECT_THROW(t.ptr<bfloat16>(), Error);
  EXPECT_THROW(t.slice(0, 1, 3), Error);
  EXPECT_EQ(t.describe(), "F32[2, 3, 4] host");
}

TEST(Arena, AlignsReusesAfterResetAndGrowsPastABlock) {
  Arena a(1024);
  void* p0;
  {
    Arena::Scope scope(a);
    p0 = a.alloc<float>(3);
    float* p1 = a.alloc<float>(5);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p0) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p1) % 64, 0u);
    EXPECT_NE(p0, static_cast<void*>(p1));
    float* big = a.alloc<float>(4096);  // larger than a block
    big[4095] = 1.0f;
  }
  EXPECT_EQ(a.alloc<float>(3), p0);  // reused after the scope
  const size_t reserved = a.reserved_bytes();
  a.reset();
  for (int i = 0; i < 3; ++i) a.alloc<float>(4096);
  a.reset();
  a.alloc<float>(4096);
  EXPECT_GE(a.reserved_bytes(), reserved);
  EXPECT_GE(a.peak_bytes(), 3 * 4096 * sizeof(float));
}
