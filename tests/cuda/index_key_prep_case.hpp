// A batch of new indexer keys for index_key_prep's tests (the emulator's and the GPU's): random
// BF16 projections, LayerNorm weights, positions over several requests with shuffled pages, and
// the CPU model's values for each token (model::layer_norm_rows, rope_cos_sin, apply_rope, in
// FP32, as model/attention.cpp computes the indexer key).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "core/paged_kv.hpp"
#include "format/codecs.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"
#include "cuda/new_tokens_batch.hpp"

namespace fp4moe::test {

struct KeyPrepCase : NewTokensBatch {
  static constexpr int kDim = 128;
  int rope_dim = 64;
  bool interleaved = true;
  std::vector<uint16_t> k;  // [T, kDim] BF16
  std::vector<float> w, b;  // LayerNorm
  // The CPU model's key of token t (FP32, before the cache's encoding).
  std::vector<float> expected(int64_t t) const {
    std::vector<float> x(kDim), y(kDim), c(size_t(rope_dim / 2 + 1)), s(size_t(rope_dim / 2 + 1));
    for (int d = 0; d < kDim; ++d) x[size_t(d)] = bf16_to_float(k[size_t(t * kDim + d)]);
    model::layer_norm_rows(x.data(), 1, kDim, w.data(), b.data(), 1e-6f, y.data());
    model::rope_cos_sin(rope, positions[size_t(t)], c.data(), s.data());
    model::apply_rope(y.data(), rope_dim, c.data(), s.data(),
                      interleaved ? model::RopeLayout::Interleaved : model::RopeLayout::HalfSplit);
    return y;
  }
};

// Requests of `new_tokens[i]` new tokens at the end of `ctx[i]` positions each.
inline KeyPrepCase make_key_prep_case(const std::vector<int>& ctx, const std::vector<int>& new_tokens, bool interleaved,
                                      uint64_t seed) {
  KeyPrepCase c;
  c.interleaved = interleaved;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d = 0; d < KeyPrepCase::kDim; ++d) {
    c.w.push_back(0.5f + float(g() % 1000) / 1000.f);
    c.b.push_back(0.1f * nd(g));
  }
  fill_new_tokens_batch(c, ctx, new_tokens, c.rope_dim, g);
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int d = 0; d < KeyPrepCase::kDim; ++d) c.k.push_back(float_to_bf16(1.5f * nd(g) + (d % 7 == 0 ? 2.f : 0.f)));
  return c;
}

inline constexpr float kKeyPrepFp8Scale = 0.05f;
inline constexpr uint8_t kKeyPrepPoison = 0xA5;

// The pool after index_key_prep over case c (bytes, poisoned with kKeyPrepPoison before): every
// token's row equals the CPU model's key within one step of the cache's encoding (the kernel's
// sums run in another order: FP32 rounding), at least 95 % exactly; rows no token owns untouched.
inline void expect_key_rows_match(const KeyPrepCase& c, const std::vector<uint8_t>& pool, bool fp8, float scale) {
  const size_t rows = size_t(c.num_pages * c.page_size), row_bytes = KeyPrepCase::kDim * (fp8 ? 1 : 2);
  ASSERT_EQ(pool.size(), rows * row_bytes);
  std::vector<bool> owned(rows, false);
  int exact = 0, total = 0;
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const int64_t slot = c.slot(t);
    owned[size_t(slot)] = true;
    const std::vector<float> want = c.expected(t);
    for (int d = 0; d < KeyPrepCase::kDim; ++d) {
      int got_code, want_code;
      if (fp8) {
        got_code = pool[size_t(slot) * KeyPrepCase::kDim + size_t(d)];
        want_code = e4m3_from_float(want[size_t(d)] / scale);
        // E4M3 codes of one sign are ordered by magnitude: one step = a neighbour code
        ASSERT_EQ(got_code & 0x80, want_code & 0x80) << "token " << t << " dim " << d;
      } else {
        const auto* h = reinterpret_cast<const uint16_t*>(pool.data());
        got_code = h[size_t(slot) * KeyPrepCase::kDim + size_t(d)];
        want_code = float_to_bf16(want[size_t(d)]);
      }
      ASSERT_LE(std::abs(got_code - want_code), 1) << "token " << t << " dim " << d << " want " << want[size_t(d)];
      exact += got_code == want_code;
      ++total;
    }
  }
  EXPECT_GE(exact, total * 95 / 100) << exact << " of " << total << " exact";
  for (size_t r = 0; r < rows; ++r) {
    if (owned[r]) continue;
    for (size_t i = 0; i < row_bytes; ++i) {
      ASSERT_EQ(pool[r * row_bytes + i], kKeyPrepPoison) << "row " << r << " was written";
    }
  }
}

}  // namespace fp4moe::test
