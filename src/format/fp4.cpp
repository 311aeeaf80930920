// NVFP4 / MXFP4 quantize (NVIDIA ModelOpt 0.47 semantics, bit for bit) and dequantize.
//
// Quantize follows modelopt/torch/quantization/qtensor/nvfp4_tensor.py
// (NVFP4QTensor.quantize with weights_scaling_factor=None) and mxfp4_tensor.py
// (MXFP4QTensor.quantize), with every operation in FP32 in the same order:
//   NVFP4: gs     = amax(|W|) / 2688                       (E2M1_MAX * E4M3_MAX)
//          s_blk  = block_amax / (6 * gs); 0 -> 1; clamp [2^-9, 448]; -> E4M3 (RNE)
//          q      = w / (float(E4M3(s_blk)) * gs)  -> E2M1, ties to even, saturating
//   MXFP4: e      = ceil(max(log2f(block_amax / 6), -127)); scale code e + 127
//          q      = w / 2^e -> E2M1, ties toward zero, zeros get the sign bit
// One deliberate difference: ModelOpt turns an all-zero NVFP4 tensor (gs = 0) into NaN
// scales (0/0) and codes 0x7; here it gets gs = 0, block scales 1.0 and codes 0, which
// decode to zeros. Every tensor with a non-zero element is bit-identical.
//
// Dequantize computes e2m1 * float(scale * gs) as ModelOpt's dequantize does, with an
// AVX2 kernel (8 packed bytes -> 16 floats through one vpermps) and a scalar fallback.
#include "format/fp4.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "format/codecs.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FP4MOE_X86 1
#endif

namespace fp4moe {

namespace {

constexpr float kNvfp4GlobalDivisor = 2688.0f;  // E2M1_MAX * E4M3_MAX
constexpr float kMinBlockScale = 0.001953125f;  // 2^-9

void check_shape(int64_t rows, int64_t cols, Fp4Format f) {
  const int block = fp4_block_size(f);
  FP4MOE_CHECK(rows >= 0 && cols >= 0, "{} quantize: negative shape [{}, {}]", fp4_format_name(f), rows, cols);
  FP4MOE_CHECK(cols % block == 0, "{} quantize: {} columns is not a multiple of the block size {}",
               fp4_format_name(f), cols, block);
}

// max |x| over n values; fails on a non-finite value (bad weights are user input).
float abs_max_finite(const float* x, int64_t n, Fp4Format f) {
  float m = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite &= (a <= 3.4028234663852886e38f);  // false for inf and NaN
    m = a > m ? a : m;
  }
  FP4MOE_CHECK(finite, "{} quantize: the weights contain a non-finite value (inf or NaN)", fp4_format_name(f));
  return m;
}

// torch.clamp(x, lo, hi): NaN stays NaN.
inline float clamp_like_torch(float x, float lo, float hi) {
  if (std::isnan(x)) return x;
  return x < lo ? lo : (x > hi ? hi : x);
}

}  // namespace

float nvfp4_global_scale_from_amax(float amax) { return amax / kNvfp4GlobalDivisor; }

Fp4Matrix quantize_nvfp4(const float* w, int64_t rows, int64_t cols, std::optional<float> global_scale) {
  check_shape(rows, cols, Fp4Format::NVFP4);
  constexpr int kBlock = 16;
  Fp4Matrix m;
  m.format = Fp4Format::NVFP4;
  m.rows = rows;
  m.cols = cols;
  m.packed.assign(size_t(rows * cols / 2), 0);      // [rows, cols/2]
  m.scales.assign(size_t(rows * cols / kBlock), 0);  // [rows, cols/16]

  const float amax = abs_max_finite(w, rows * cols, Fp4Format::NVFP4);
  float gs;
  if (global_scale) {
    gs = *global_scale;
    FP4MOE_CHECK(std::isfinite(gs) && gs >= 0.0f, "nvfp4 quantize: global scale {} is not finite and >= 0", gs);
  } else {
    gs = nvfp4_global_scale_from_amax(amax);
  }
  m.global_scale = gs;
  const float gs6 = 6.0f * gs;  // E2M1_MAX * weights_scaling_factor_2, rounded to FP32

  const int64_t blocks = rows * cols / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kBlock;
    float bamax = 0.0f;
    for (int i = 0; i < kBlock; ++i) bamax = std::max(bamax, std::fabs(x[i]));
    uint8_t code;
    if (gs == 0.0f) {
      code = 0x38;  // all-zero tensor: scale 1.0 (ModelOpt: NaN, see the file comment)
    } else {
      float s = bamax / gs6;
      if (s == 0.0f) s = 1.0f;
      code = e4m3_from_float(clamp_like_torch(s, kMinBlockScale, kE4M3Max));
    }
    m.scales[size_t(b)] = code;
    const float denom = e4m3_to_float(code) * gs;
    uint8_t* out = m.packed.data() + b * (kBlock / 2);
    for (int i = 0; i < kBlock; i += 2) {
      // gs == 0 only for an all-zero tensor: every element is a zero, code 0.
      const uint8_t lo = gs == 0.0f ? 0 : e2m1_from_float_nvfp4(x[i] / denom);
      const uint8_t hi = gs == 0.0f ? 0 : e2m1_from_float_nvfp4(x[i + 1] / denom);
      out[i / 2] = e2m1_pack(lo, hi);
    }
  }
  return m;
}

Fp4Matrix quantize_mxfp4(const float* w, int64_t rows, int64_t cols) {
  check_shape(rows, cols, Fp4Format::MXFP4);
  constexpr int kBlock = 32;
  Fp4Matrix m;
  m.format = Fp4Format::MXFP4;
  m.rows = rows;
  m.cols = cols;
  m.global_scale = 1.0f;
  m.packed.assign(size_t(rows * cols / 2), 0);      // [rows, cols/2]
  m.scales.assign(size_t(rows * cols / kBlock), 0);  // [rows, cols/32]
  abs_max_finite(w, rows * cols, Fp4Format::MXFP4);

  const int64_t blocks = rows * cols / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kBlock;
    float bamax = 0.0f;
    for (int i = 0; i < kBlock; ++i) bamax = std::max(bamax, std::fabs(x[i]));
    const float descale = bamax / 6.0f;
    // torch.log2 in FP32; the double log2 rounded to float is the correctly rounded FP32
    // result (torch's SLEEF log2f is within 1 ULP; the fixtures cover the near-2^k cases).
    const float l = descale == 0.0f ? -INFINITY : float(std::log2(double(descale)));
    const float e = std::ceil(std::max(l, -127.0f));
    const float scale = std::ldexp(1.0f, int(e));  // exact, 2^-127 is a subnormal
    m.scales[size_t(b)] = uint8_t(int(e) + kE8M0Bias);
    uint8_t* out = m.packed.data() + b * (kBlock / 2);
    for (int i = 0; i < kBlock; i += 2)
      out[i / 2] = e2m1_pack(e2m1_from_float_mxfp4(x[i] / scale), e2m1_from_float_mxfp4(x[i + 1] / scale));
  }
  return m;
}

// ---- dequantize ------------------------------------------------------------------------

namespace {

inline float block_multiplier(const Fp4MatrixView& m, uint8_t s) {
  return m.format == Fp4Format::NVFP4 ? e4m3_to_float(s) * m.global_scale : e8m0_to_float(s);
}

void check_view(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end) {
  FP4MOE_CHECK(m.cols % fp4_block_size(m.format) == 0, "{} dequantize: {} columns is not a multiple of {}",
               fp4_format_name(m.format), m.cols, fp4_block_size(m.format));
  FP4MOE_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= m.rows,
               "{} dequantize: rows [{}, {}) outside [0, {})", fp4_format_name(m.format), row_begin, row_end, m.rows);
}

// Scalar: per block a 16-entry table of scaled values, then one lookup per nibble.
template <typename Store>
void dequantize_rows_scalar(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, Store store) {
  const int block = fp4_block_size(m.format);
  const int64_t blocks_per_row = m.cols / block;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* p = m.packed + r * (m.cols / 2);
    const uint8_t* s = m.scales + r * blocks_per_row;
    const int64_t out_row = (r - row_begin) * m.cols;
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      const float mult = block_multiplier(m, s[b]);
      float lut[16];
      for (int i = 0; i < 16; ++i) lut[i] = kE2M1Table[i] * mult;
      for (int j = 0; j < block / 2; ++j) {
        const uint8_t byte = p[b * (block / 2) + j];
        const int64_t c = out_row + b * block + 2 * j;
        store(c, lut[byte & 0xF]);
        store(c + 1, lut[byte >> 4]);
      }
    }
  }
}

#ifdef FP4MOE_X86

// 8 packed bytes (16 codes) -> 16 floats: v = lut8[code & 7] ^ (sign bit of code << 28).
__attribute__((target("avx2,fma"))) inline void decode16_avx2(const uint8_t* p, __m256 lut8, __m256& v0,
                                                               __m256& v1) {
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_and_si128(b, nib);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
  const __m128i codes = _mm_unpacklo_epi8(lo, hi);  // element order: lo0 hi0 lo1 hi1 ...
  const __m256i i0 = _mm256_cvtepu8_epi32(codes);
  const __m256i i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8));
  const __m256i sign_mask = _mm256_set1_epi32(int(0x80000000u));
  // vpermps reads index bits 2..0 only: the magnitude; bit 3 shifted to bit 31 is the sign.
  v0 = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut8, i0),
                     _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(i0, 28), sign_mask)));
  v1 = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut8, i1),
                     _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(i1, 28), sign_mask)));
}

// float -> bf16 bits, round to nearest even, NaN -> quiet NaN (as core/bf16.hpp).
__attribute__((target("avx2,fma"))) inline __m256i to_bf16_avx2(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

template <bool kBf16>
__attribute__((target("avx2,fma"))) void dequantize_rows_avx2(const Fp4MatrixView& m, int64_t row_begin,
                                                              int64_t row_end, void* out_any) {
  const int block = fp4_block_size(m.format);
  const int64_t blocks_per_row = m.cols / block;
  const __m256 mag8 = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* p = m.packed + r * (m.cols / 2);
    const uint8_t* s = m.scales + r * blocks_per_row;
    const int64_t out_row = (r - row_begin) * m.cols;
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      const __m256 lut8 = _mm256_mul_ps(mag8, _mm256_set1_ps(block_multiplier(m, s[b])));
      for (int h = 0; h < block / 16; ++h) {
        __m256 v0, v1;
        decode16_avx2(p + b * (block / 2) + h * 8, lut8, v0, v1);
        const int64_t c = out_row + b * block + h * 16;
        if constexpr (kBf16) {
          // packus interleaves 128-bit lanes: [v0 0-3, v1 0-3, v0 4-7, v1 4-7] -> reorder.
          const __m256i packed = _mm256_packus_epi32(to_bf16_avx2(v0), to_bf16_avx2(v1));
          const __m256i ordered = _mm256_permute4x64_epi64(packed, 0xD8);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out_any) + c), ordered);
        } else {
          float* out = static_cast<float*>(out_any) + c;
          _mm256_storeu_ps(out, v0);
          _mm256_storeu_ps(out + 8, v1);
        }
      }
    }
  }
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

#endif  // FP4MOE_X86

}  // namespace

void dequantize_rows(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, float* out) {
  check_view(m, row_begin, row_end);
#ifdef FP4MOE_X86
  if (cpu_has_avx2()) return dequantize_rows_avx2<false>(m, row_begin, row_end, out);
#endif
  dequantize_rows_scalar(m, row_begin, row_end, [out](int64_t i, float v) { out[i] = v; });
}

void dequantize_rows_bf16(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, uint16_t* out) {
  check_view(m, row_begin, row_end);
#ifdef FP4MOE_X86
  if (cpu_has_avx2()) return dequantize_rows_avx2<true>(m, row_begin, row_end, out);
#endif
  dequantize_rows_scalar(m, row_begin, row_end, [out](int64_t i, float v) { out[i] = float_to_bf16(v); });
}

}  // namespace fp4moe
