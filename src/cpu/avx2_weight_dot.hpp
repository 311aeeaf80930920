// AVX2/FMA dot products of ONE weight row against up to 8 activation rows (tokens) at once.
//
// The weight row is decoded 32 elements at a time straight into registers (never into a
// dequantized copy), and each decoded vector is FMA'd against every token of the tile, so
// a weight byte is decoded once per tile of <= 8 tokens. FP32 accumulation throughout.
//
// FP4 decode of 8 elements (one 32-bit word of 8 nibbles, element i in bits 4i..4i+3):
//   code = word >> 4i                      per lane (vpsrlvd); low 3 bits = magnitude index
//   v    = tbl[code & 7] ^ (code << 28)    (vpermps + vpslld + vxorps)
// where the block's table tbl[m] = bits(e2m1[m] * block_scale) ^ (m << 28) is built once per
// block: the XOR restores the magnitude bits and sets the sign (bit 3 of code -> bit 31).
// 4 vector ops per 8 weights (one shuffle) + 2 per block, plus the FMAs.
//
// Internal to src/cpu: compiled with -march=x86-64-v3.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace fp4moe::cpu {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// FP4 row: packed [K/2], scales [K/kBlock], table = 256-entry block-scale table (scale_tables.hpp).
template <int kBlock>
struct Fp4Row {
  static_assert(kBlock == 16 || kBlock == 32);
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  const float* table = nullptr;

  struct Consts {
    __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256 e2m1 = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    __m256 mag_bits = _mm256_castsi256_ps(_mm256_setr_epi32(0 << 28, 1 << 28, 2 << 28, 3 << 28, 4 << 28,
                                                            5 << 28, 6 << 28, 7 << 28));
  };

  // The block's lookup table: lane m = bits(e2m1[m] * scale) XOR (m << 28).
  static __m256 block_table(float scale, const Consts& c) {
    return _mm256_xor_ps(_mm256_mul_ps(c.e2m1, _mm256_set1_ps(scale)), c.mag_bits);
  }
  // 8 elements from one 32-bit word: lane i gets code = word >> 4i (low 3 bits index the
  // table), and (code << 28) carries the sign to bit 31 and re-XORs the magnitude bits.
  static __m256 decode8(const uint8_t* p, __m256 tbl, const Consts& c) {
    int32_t word;
    std::memcpy(&word, p, 4);
    const __m256i code = _mm256_srlv_epi32(_mm256_set1_epi32(word), c.shifts);
    const __m256 v = _mm256_permutevar8x32_ps(tbl, code);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)));
  }
  // Elements [k, k + 32) -> w[0..3]. k is a multiple of 32.
  void decode32(int64_t k, __m256 w[4], const Consts& c) const {
    const uint8_t* p = packed + k / 2;
    __m256 t0, t1;
    if constexpr (kBlock == 16) {
      t0 = block_table(table[scales[k / 16]], c);
      t1 = block_table(table[scales[k / 16 + 1]], c);
    } else {
      t0 = t1 = block_table(table[scales[k / 32]], c);
    }
    w[0] = decode8(p, t0, c);
    w[1] = decode8(p + 4, t0, c);
    w[2] = decode8(p + 8, t1, c);
    w[3] = decode8(p + 12, t1, c);
  }
  // Elements [k, k + 16) -> w[0..1] (the K % 32 == 16 tail; NVFP4 only).
  void decode16(int64_t k, __m256 w[2], const Consts& c) const {
    const __m256 t = block_table(table[scales[k / kBlock]], c);
    w[0] = decode8(packed + k / 2, t, c);
    w[1] = decode8(packed + k / 2 + 4, t, c);
  }
};

// BF16 row [K] (bf16 bits).
struct Bf16Row {
  const uint16_t* w = nullptr;
  struct Consts {};
  static __m256 decode8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  void decode32(int64_t k, __m256 v[4], const Consts&) const {
    for (int j = 0; j < 4; ++j) v[j] = decode8(w + k + 8 * j);
  }
  void decode16(int64_t k, __m256 v[2], const Consts&) const {
    for (int j = 0; j < 2; ++j) v[j] = decode8(w + k + 8 * j);
  }
};

// FP32 row [K] (the router).
struct F32Row {
  const float* w = nullptr;
  struct Consts {};
  void decode32(int64_t k, __m256 v[4], const Consts&) const {
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(w + k + 8 * j);
  }
  void decode16(int64_t k, __m256 v[2], const Consts&) const {
    for (int j = 0; j < 2; ++j) v[j] = _mm256_loadu_ps(w + k + 8 * j);
  }
};

// out[m] = dot(row, x[m][0..K)) for m < M. K is a multiple of 16.
template <int M, class Row>
inline void dot_row_tokens(const Row& row, int64_t K, const float* const* x, float* out) {
  // Two independent accumulators per token, for every M: the summation order of a token's dot
  // product does not depend on how many tokens share the tile, so a row computes the same bits
  // alone or in any batch (speculative decoding's verify rows equal one-token decode steps;
  // model/speculative.hpp). Two chains halve the FMA latency limit at M = 1.
  constexpr int P = 2;
  const typename Row::Consts c{};
  __m256 acc[M][P];
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p) acc[m][p] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m256 w[4];
    row.decode32(k, w, c);
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < 4; ++j)
        acc[m][j % P] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(x[m] + k + 8 * j), acc[m][j % P]);
  }
  if (k < K) {
    __m256 w[2];
    row.decode16(k, w, c);
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < 2; ++j)
        acc[m][j % P] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(x[m] + k + 8 * j), acc[m][j % P]);
  }
  for (int m = 0; m < M; ++m) {
    __m256 s = acc[m][0];
    for (int p = 1; p < P; ++p) s = _mm256_add_ps(s, acc[m][p]);
    out[m] = hsum(s);
  }
}

inline constexpr int kMaxTokenTile = 8;

// Runtime tile size 1..kMaxTokenTile.
template <class Row>
inline void dot_row_tile(const Row& row, int64_t K, const float* const* x, int m, float* out) {
  switch (m) {
    case 1: dot_row_tokens<1>(row, K, x, out); break;
    case 2: dot_row_tokens<2>(row, K, x, out); break;
    case 3: dot_row_tokens<3>(row, K, x, out); break;
    case 4: dot_row_tokens<4>(row, K, x, out); break;
    case 5: dot_row_tokens<5>(row, K, x, out); break;
    case 6: dot_row_tokens<6>(row, K, x, out); break;
    case 7: dot_row_tokens<7>(row, K, x, out); break;
    case 8: dot_row_tokens<8>(row, K, x, out); break;
    default: break;
  }
}

}  // namespace fp4moe::cpu
