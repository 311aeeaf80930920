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
// Quantize and dequantize have AVX2 block kernels (runtime-dispatched) and portable scalar
// paths that give identical bytes. Dequantize computes e2m1 * float(scale * gs) as
// ModelOpt's dequantize does; its AVX2 kernel turns 8 packed bytes into 16 floats through
// one vpermps per 8 outputs.
#include "format/fp4.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "format/codecs.hpp"
#include "format/fp4_detail.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FP4MOE_X86 1
#endif

namespace fp4moe {

namespace {

std::atomic<bool> g_simd_enabled{true};

#ifdef FP4MOE_X86
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

bool use_avx2() {
#ifdef FP4MOE_X86
  return cpu_has_avx2() && g_simd_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

constexpr float kNvfp4GlobalDivisor = 2688.0f;  // E2M1_MAX * E4M3_MAX
constexpr float kMinBlockScale = 0.001953125f;  // 2^-9

void check_shape(int64_t rows, int64_t cols, Fp4Format f) {
  const int block = fp4_block_size(f);
  FP4MOE_CHECK(rows >= 0 && cols >= 0, "{} quantize: negative shape [{}, {}]", fp4_format_name(f), rows, cols);
  FP4MOE_CHECK(cols % block == 0, "{} quantize: {} columns is not a multiple of the block size {}",
               fp4_format_name(f), cols, block);
}

#ifdef FP4MOE_X86
// max |x| over [0, n & ~7); *finite cleared if any of them is inf or NaN.
__attribute__((target("avx2,fma"))) float abs_max_finite_avx2(const float* x, int64_t n, bool* finite) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 flt_max = _mm256_set1_ps(3.4028234663852886e38f);
  __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, flt_max, _CMP_NLE_UQ));
    m = _mm256_max_ps(m, a);
  }
  if (_mm256_movemask_ps(bad)) *finite = false;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  return *std::max_element(lanes, lanes + 8);
}
#endif

// max |x| over n values; fails on a non-finite value (bad weights are user input).
float abs_max_finite(const float* x, int64_t n, Fp4Format f) {
  float m = 0.0f;
  bool finite = true;
  int64_t i = 0;
#ifdef FP4MOE_X86
  if (use_avx2()) {
    m = abs_max_finite_avx2(x, n, &finite);
    i = n & ~int64_t(7);
  }
#endif
  for (; i < n; ++i) {
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

// ---- block encoders: 16 elements x[i] / d -> 8 packed bytes ----------------------------

float block_abs_max_scalar(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

void encode16_nvfp4_scalar(const float* x, float d, uint8_t* out) {
  for (int i = 0; i < 16; i += 2)
    out[i / 2] = e2m1_pack(e2m1_from_float_nvfp4(x[i] / d), e2m1_from_float_nvfp4(x[i + 1] / d));
}

void encode16_mxfp4_scalar(const float* x, float d, uint8_t* out) {
  for (int i = 0; i < 16; i += 2)
    out[i / 2] = e2m1_pack(e2m1_from_float_mxfp4(x[i] / d), e2m1_from_float_mxfp4(x[i + 1] / d));
}

#ifdef FP4MOE_X86

__attribute__((target("avx2,fma"))) float block_abs_max_avx2(const float* x, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// 8 codes in int32 lanes: q = x / d (the same IEEE division as the scalar path), then the
// codecs.hpp rules. kNvfp4: ord = #{bounds b : !(|q| <= b)} (so NaN counts 7, as
// torch.searchsorted), +1 at the odd bounds, sign for q < 0. MXFP4: ord = #{b : |q| > b},
// sign unless q > 0.
template <bool kNvfp4>
__attribute__((target("avx2,fma"))) inline __m256i encode8_avx2(const float* x, __m256 d) {
  const __m256 q = _mm256_div_ps(_mm256_loadu_ps(x), d);
  const __m256 a = _mm256_and_ps(q, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  constexpr float kBounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  __m256i ord = _mm256_setzero_si256();
  for (float b : kBounds) {
    const __m256 c = kNvfp4 ? _mm256_cmp_ps(a, _mm256_set1_ps(b), _CMP_NLE_UQ)
                            : _mm256_cmp_ps(a, _mm256_set1_ps(b), _CMP_GT_OQ);
    ord = _mm256_sub_epi32(ord, _mm256_castps_si256(c));  // true lanes are -1
  }
  __m256 sign;
  if constexpr (kNvfp4) {
    const __m256 odd = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(a, _mm256_set1_ps(0.75f), _CMP_EQ_OQ),
                                                 _mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_EQ_OQ)),
                                    _mm256_cmp_ps(a, _mm256_set1_ps(3.5f), _CMP_EQ_OQ));
    ord = _mm256_sub_epi32(ord, _mm256_castps_si256(odd));
    sign = _mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_LT_OQ);
  } else {
    sign = _mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_NGT_UQ);
  }
  return _mm256_or_si256(ord, _mm256_and_si256(_mm256_castps_si256(sign), _mm256_set1_epi32(8)));
}

// In each 64-bit lane: low dword e[2j], high dword e[2j+1] -> byte e[2j] | e[2j+1] << 4.
__attribute__((target("avx2,fma"))) inline __m256i pair_nibbles_avx2(__m256i c) {
  return _mm256_or_si256(_mm256_and_si256(c, _mm256_set1_epi64x(0x0F)),
                         _mm256_and_si256(_mm256_srli_epi64(c, 28), _mm256_set1_epi64x(0xF0)));
}

// Two vectors of 8 codes (elements 0-7, 8-15) -> 8 bytes, element 2j in the low nibble.
__attribute__((target("avx2,fma"))) inline void pack16_avx2(__m256i c0, __m256i c1, uint8_t* out) {
  const auto pair = pair_nibbles_avx2;
  const __m256i gather = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m128i p0 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pair(c0), gather));
  const __m128i p1 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pair(c1), gather));
  const __m128i w16 = _mm_packus_epi32(p0, p1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w16, w16));
}

template <bool kNvfp4>
__attribute__((target("avx2,fma"))) void encode16_avx2(const float* x, float d, uint8_t* out) {
  const __m256 dv = _mm256_set1_ps(d);
  pack16_avx2(encode8_avx2<kNvfp4>(x, dv), encode8_avx2<kNvfp4>(x + 8, dv), out);
}

#endif  // FP4MOE_X86

struct BlockKernels {
  float (*abs_max)(const float*, int);
  void (*encode16)(const float*, float, uint8_t*);
};

BlockKernels block_kernels(Fp4Format f) {
#ifdef FP4MOE_X86
  if (use_avx2())
    return {block_abs_max_avx2, f == Fp4Format::NVFP4 ? encode16_avx2<true> : encode16_avx2<false>};
#endif
  return {block_abs_max_scalar, f == Fp4Format::NVFP4 ? encode16_nvfp4_scalar : encode16_mxfp4_scalar};
}

}  // namespace

namespace detail {
void set_fp4_simd_enabled(bool enabled) { g_simd_enabled.store(enabled); }
bool fp4_simd_active() { return use_avx2(); }
}  // namespace detail

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
    FP4MOE_CHECK(gs > 0.0f || amax == 0.0f, "nvfp4 quantize: global scale 0 for a tensor with amax {}", amax);
  } else {
    gs = nvfp4_global_scale_from_amax(amax);
  }
  m.global_scale = gs;
  const float gs6 = 6.0f * gs;  // E2M1_MAX * weights_scaling_factor_2, rounded to FP32
  const BlockKernels k = block_kernels(Fp4Format::NVFP4);

  const int64_t blocks = rows * cols / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kBlock;
    uint8_t* out = m.packed.data() + b * (kBlock / 2);
    if (gs == 0.0f) {
      // All-zero tensor: scale 1.0 and code 0 (ModelOpt: NaN, see the file comment).
      m.scales[size_t(b)] = 0x38;
      continue;  // packed is already zero
    }
    float s = k.abs_max(x, kBlock) / gs6;
    if (s == 0.0f) s = 1.0f;
    const uint8_t code = e4m3_from_float(clamp_like_torch(s, kMinBlockScale, kE4M3Max));
    m.scales[size_t(b)] = code;
    k.encode16(x, e4m3_to_float(code) * gs, out);
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
  const BlockKernels k = block_kernels(Fp4Format::MXFP4);

  const int64_t blocks = rows * cols / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kBlock;
    const float descale = k.abs_max(x, kBlock) / 6.0f;
    // torch.log2 in FP32; the double log2 rounded to float is the correctly rounded FP32
    // result (torch's SLEEF log2f is within 1 ULP; the fixtures cover the near-2^k cases).
    const float l = descale == 0.0f ? -INFINITY : float(std::log2(double(descale)));
    const float e = std::ceil(std::max(l, -127.0f));
    const float scale = std::ldexp(1.0f, int(e));  // exact, 2^-127 is a subnormal
    m.scales[size_t(b)] = uint8_t(int(e) + kE8M0Bias);
    uint8_t* out = m.packed.data() + b * (kBlock / 2);
    k.encode16(x, scale, out);
    k.encode16(x + 16, scale, out + 8);
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
      __m256 lut8 = _mm256_mul_ps(mag8, _mm256_set1_ps(block_multiplier(m, s[b])));
      // BF16: round the 8 scaled magnitudes once per block (rounding commutes with the
      // sign flip), so each element is a lookup and a shift.
      if constexpr (kBf16) lut8 = _mm256_castsi256_ps(_mm256_slli_epi32(to_bf16_avx2(lut8), 16));
      for (int h = 0; h < block / 16; ++h) {
        __m256 v0, v1;
        decode16_avx2(p + b * (block / 2) + h * 8, lut8, v0, v1);
        const int64_t c = out_row + b * block + h * 16;
        if constexpr (kBf16) {
          // packus interleaves 128-bit lanes: [v0 0-3, v1 0-3, v0 4-7, v1 4-7] -> reorder.
          const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(v0), 16),
                                                     _mm256_srli_epi32(_mm256_castps_si256(v1), 16));
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

#endif  // FP4MOE_X86

}  // namespace

void dequantize_rows(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, float* out) {
  check_view(m, row_begin, row_end);
#ifdef FP4MOE_X86
  if (use_avx2()) return dequantize_rows_avx2<false>(m, row_begin, row_end, out);
#endif
  dequantize_rows_scalar(m, row_begin, row_end, [out](int64_t i, float v) { out[i] = v; });
}

void dequantize_rows_bf16(const Fp4MatrixView& m, int64_t row_begin, int64_t row_end, uint16_t* out) {
  check_view(m, row_begin, row_end);
#ifdef FP4MOE_X86
  if (use_avx2()) return dequantize_rows_avx2<true>(m, row_begin, row_end, out);
#endif
  dequantize_rows_scalar(m, row_begin, row_end, [out](int64_t i, float v) { out[i] = float_to_bf16(v); });
}

}  // namespace fp4moe
