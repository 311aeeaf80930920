// A batch of new latent keys for kv_latent_prep's tests (the emulator's and the GPU's): random
// BF16 kv_a projections [latent 512 | rope 64], an RMSNorm weight, positions over several
// requests with shuffled pages, and the CPU model's values for each token
// (model::rms_norm_rows, rope_cos_sin, apply_rope in FP32, as model/attention.cpp computes them).
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

struct LatentPrepCase : NewTokensBatch {
  static constexpr int kCkv = 512, kKpe = 64, kRow = kCkv + kKpe;
  bool interleaved = true;
  std::vector<uint16_t> kv;  // [T, kRow] BF16
  std::vector<float> w;      // RMSNorm weight [kCkv]
  // The CPU model's [ckv 512 | kpe 64] of token t (FP32, before the cache's encoding).
  std::vector<float> expected(int64_t t) const {
    std::vector<float> x(kRow), y(kRow), c(size_t(kKpe / 2)), s(size_t(kKpe / 2));
    for (int d = 0; d < kRow; ++d) x[size_t(d)] = bf16_to_float(kv[size_t(t * kRow + d)]);
    model::rms_norm_rows(x.data(), 1, kCkv, kRow, w.data(), 1e-6f, y.data(), kRow);
    std::copy(x.begin() + kCkv, x.end(), y.begin() + kCkv);
    model::rope_cos_sin(rope, positions[size_t(t)], c.data(), s.data());
    model::apply_rope(y.data() + kCkv, kKpe, c.data(), s.data(),
                      interleaved ? model::RopeLayout::Interleaved : model::RopeLayout::HalfSplit);
    return y;
  }
};

// Requests of `new_tokens[i]` new tokens at the end of `ctx[i]` positions each.
inline LatentPrepCase make_latent_prep_case(const std::vector<int>& ctx, const std::vector<int>& new_tokens,
                                            bool interleaved, uint64_t seed) {
  LatentPrepCase c;
  c.interleaved = interleaved;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d = 0; d < LatentPrepCase::kCkv; ++d) c.w.push_back(0.5f + float(g() % 1000) / 1000.f);
  fill_new_tokens_batch(c, ctx, new_tokens, LatentPrepCase::kKpe, g);
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int d = 0; d < LatentPrepCase::kRow; ++d)
      c.kv.push_back(float_to_bf16(1.5f * nd(g) + (d % 7 == 0 ? 2.f : 0.f)));
  return c;
}

inline constexpr float kLatentFp8CkvScale = 0.02f, kLatentFp8KpeScale = 0.05f;
inline constexpr uint8_t kLatentPoison = 0xA5;

// The two pools after kv_latent_prep over case c (bytes, poisoned with kLatentPoison before): every
// token's rows equal the CPU model's within one step of the cache's encoding (the kernel's sum of
// squares runs in another order, and cosf / sinf may differ from the host's by an ulp), at least
// 95 % exactly; rows no token owns untouched.
inline void expect_latent_rows_match(const LatentPrepCase& c, const std::vector<uint8_t>& ckv,
                                     const std::vector<uint8_t>& kpe, bool fp8) {
  const size_t rows = size_t(c.num_pages * c.page_size), e = fp8 ? 1 : 2;
  ASSERT_EQ(ckv.size(), rows * LatentPrepCase::kCkv * e);
  ASSERT_EQ(kpe.size(), rows * LatentPrepCase::kKpe * e);
  std::vector<bool> owned(rows, false);
  int exact = 0, total = 0;
  auto code_at = [&](const std::vector<uint8_t>& pool, int64_t slot, int dim, int d) {
    return fp8 ? int(pool[size_t(slot * dim + d)])
               : int(reinterpret_cast<const uint16_t*>(pool.data())[size_t(slot * dim + d)]);
  };
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const int64_t slot = c.slot(t);
    owned[size_t(slot)] = true;
    const std::vector<float> want = c.expected(t);
    for (int d = 0; d < LatentPrepCase::kRow; ++d) {
      const bool latent = d < LatentPrepCase::kCkv;
      const int dim = latent ? LatentPrepCase::kCkv : LatentPrepCase::kKpe, i = latent ? d : d - LatentPrepCase::kCkv;
      const int got = code_at(latent ? ckv : kpe, slot, dim, i);
      const float scale = latent ? kLatentFp8CkvScale : kLatentFp8KpeScale;
      const int want_code = fp8 ? e4m3_from_float(want[size_t(d)] / scale) : float_to_bf16(want[size_t(d)]);
      if (fp8) {  // codes of one sign are ordered by magnitude: one step = a neighbour code
        ASSERT_EQ(got & 0x80, want_code & 0x80) << "token " << t << " dim " << d;
      }
      ASSERT_LE(std::abs(got - want_code), 1) << "token " << t << " dim " << d << " want " << want[size_t(d)];
      exact += got == want_code;
      ++total;
    }
  }
  EXPECT_GE(exact, total * 95 / 100) << exact << " of " << total << " exact";
  for (size_t r = 0; r < rows; ++r) {
    if (owned[r]) continue;
    for (size_t i = 0; i < LatentPrepCase::kCkv * e; ++i) ASSERT_EQ(ckv[r * LatentPrepCase::kCkv * e + i], kLatentPoison) << "ckv row " << r;
    for (size_t i = 0; i < LatentPrepCase::kKpe * e; ++i) ASSERT_EQ(kpe[r * LatentPrepCase::kKpe * e + i], kLatentPoison) << "kpe row " << r;
  }
}

}  // namespace fp4moe::test
