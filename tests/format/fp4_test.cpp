// NVFP4 / MXFP4: bit-exactness against golden ModelOpt fixtures, quantize -> dequantize
// error bounds, the vectorized dequantize against a scalar reference, and its throughput.
#include "format/fp4.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "format/codecs.hpp"
#include "format/fp4_detail.hpp"

namespace fp4moe {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Fixtures {
  nlohmann::json manifest;
  std::vector<uint8_t> blob;
};

const Fixtures& fixtures() {
  static const Fixtures fx = [] {
    const std::string dir = std::string(FP4MOE_SOURCE_DIR) + "/tests/format/fixtures/";
    Fixtures f;
    const auto text = read_file(dir + "modelopt_fp4.json");
    f.manifest = nlohmann::json::parse(text.begin(), text.end());
    f.blob = read_file(dir + "modelopt_fp4.bin");
    return f;
  }();
  return fx;
}

std::string hex(uint8_t b) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%02x", b);
  return s;
}

// Compares byte arrays; on mismatch names the first differing index and the count.
::testing::AssertionResult bytes_equal(const uint8_t* want, const uint8_t* got, size_t n, const std::string& what,
                                       const float* input, int per_byte) {
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (want[i] != got[i]) {
      if (first == n) first = i;
      ++bad;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << ": " << bad << " of " << n << " bytes differ; first at " << first << ": modelopt "
     << hex(want[first]) << ", ours " << hex(got[first]);
  if (input) os << " (input[" << first * per_byte << "] = " << input[first * per_byte] << ")";
  return ::testing::AssertionFailure() << os.str();
}

TEST(Fp4Fixtures, ManifestCoversEveryCaseKind) {
  const auto& m = fixtures().manifest;
  EXPECT_EQ(m["modelopt"], "0.47.0");
  EXPECT_EQ(size_t(m["bin_bytes"]), fixtures().blob.size());
  int nv = 0, mx = 0;
  for (const auto& c : m["cases"]) (c["format"] == "nvfp4" ? nv : mx)++;
  EXPECT_GE(nv, 10);
  EXPECT_GE(mx, 6);
}

// Every fixture case, quantized by the current kernels (AVX2 or portable).
void check_fixtures_bit_exact() {
  const auto& fx = fixtures();
  int checked = 0;
  for (const auto& c : fx.manifest["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const int64_t rows = c["rows"], cols = c["cols"];
    const bool nvfp4 = c["format"] == "nvfp4";
    const int block = nvfp4 ? 16 : 32;
    const float* x = reinterpret_cast<const float*>(fx.blob.data() + size_t(c["input_offset"]));
    const uint8_t* want_packed = fx.blob.data() + size_t(c["packed_offset"]);
    const uint8_t* want_scales = fx.blob.data() + size_t(c["scales_offset"]);
    const float want_gs = from_bits(uint32_t(c["global_scale_bits"]));
    std::vector<float> input(x, x + rows * cols);  // aligned copy

    Fp4Matrix q;
    if (nvfp4) {
      std::optional<float> gs;
      if (!c["explicit_global_scale_bits"].is_null()) gs = from_bits(uint32_t(c["explicit_global_scale_bits"]));
      q = quantize_nvfp4(input.data(), rows, cols, gs);
    } else {
      q = quantize_mxfp4(input.data(), rows, cols);
    }
    ASSERT_EQ(q.packed.size(), size_t(rows * cols / 2));
    ASSERT_EQ(q.scales.size(), size_t(rows * cols / block));

    if (name == "nvfp4_all_zero_tensor") {
      // ModelOpt computes 0/0 here: NaN scales and codes 7. Ours: gs 0, scale 1.0, code 0.
      for (int64_t i = 0; i < rows * cols / block; ++i) EXPECT_EQ(want_scales[i] & 0x7F, 0x7F);
      for (int64_t i = 0; i < rows * cols / 2; ++i) EXPECT_EQ(want_packed[i], 0x77);
      EXPECT_EQ(want_gs, 0.0f);
      EXPECT_EQ(q.global_scale, 0.0f);
      for (uint8_t s : q.scales) EXPECT_EQ(s, 0x38);
      for (uint8_t p : q.packed) EXPECT_EQ(p, 0x00);
      continue;
    }
    EXPECT_EQ(bits(q.global_scale), bits(want_gs)) << q.global_scale << " vs " << want_gs;
    EXPECT_TRUE(bytes_equal(want_scales, q.scales.data(), q.scales.size(), "scales", input.data(), block));
    EXPECT_TRUE(bytes_equal(want_packed, q.packed.data(), q.packed.size(), "packed", input.data(), 2));
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

// Runs the body with the AVX2 kernels switched off, restoring them afterwards.
struct PortableScope {
  PortableScope() { detail::set_fp4_simd_enabled(false); }
  ~PortableScope() { detail::set_fp4_simd_enabled(true); }
};

TEST(Fp4Fixtures, QuantizeIsBitExactWithModelOpt) {
  std::printf("[ info ] AVX2 kernels %s\n", detail::fp4_simd_active() ? "active" : "not available");
  check_fixtures_bit_exact();
}

TEST(Fp4Fixtures, QuantizeIsBitExactWithModelOptPortablePath) {
  PortableScope portable;
  ASSERT_FALSE(detail::fp4_simd_active());
  check_fixtures_bit_exact();
}

// Random data with many ties, zeros, tiny and huge blocks: both paths give equal bytes.
TEST(Fp4Quantize, SimdAndPortablePathsAgree) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = 96, cols = 256;
  std::vector<float> w(size_t(rows * cols));
  const float specials[] = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, -3.5f, -0.75f, 1e-40f};
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, int(rng() % 60) - 30);
    for (int64_t c = 0; c < cols; ++c) {
      float v = nd(rng) * mag;
      if (rng() % 4 == 0) v = specials[rng() % 13] * (r % 3 == 0 ? 1.0f : mag);
      if (r % 17 == 0 && c < 64) v = 0.0f;  // all-zero blocks
      w[size_t(r * cols + c)] = v;
    }
  }
  for (Fp4Format f : {Fp4Format::NVFP4, Fp4Format::MXFP4}) {
    SCOPED_TRACE(std::string(fp4_format_name(f)));
    for (std::optional<float> gs : {std::optional<float>(), std::optional<float>(1.0f), std::optional<float>(1e-3f)}) {
      if (f == Fp4Format::MXFP4 && gs) continue;
      auto q = [&] { return f == Fp4Format::NVFP4 ? quantize_nvfp4(w.data(), rows, cols, gs) : quantize_mxfp4(w.data(), rows, cols); };
      const Fp4Matrix a = q();
      Fp4Matrix b;
      {
        PortableScope portable;
        b = q();
      }
      EXPECT_EQ(bits(a.global_scale), bits(b.global_scale));
      EXPECT_TRUE(bytes_equal(b.scales.data(), a.scales.data(), a.scales.size(), "scales", w.data(), fp4_block_size(f)));
      EXPECT_TRUE(bytes_equal(b.packed.data(), a.packed.data(), a.packed.size(), "packed", w.data(), 2));
      // And dequantize: both paths, both output types.
      std::vector<float> da(w.size()), db(w.size());
      std::vector<uint16_t> ha(w.size()), hb(w.size());
      dequantize_rows(a.view(), 0, rows, da.data());
      dequantize_rows_bf16(a.view(), 0, rows, ha.data());
      {
        PortableScope portable;
        dequantize_rows(a.view(), 0, rows, db.data());
        dequantize_rows_bf16(a.view(), 0, rows, hb.data());
      }
      EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size() * 4), 0);
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * 2), 0);
    }
  }
}

// The ModelOpt dequantize formula, scalar, in double where exact: e2m1 * float(s * gs).
float dequant_ref(const Fp4MatrixView& m, int64_t r, int64_t c) {
  const int block = fp4_block_size(m.format);
  const uint8_t byte = m.packed[r * (m.cols / 2) + c / 2];
  const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  const uint8_t s = m.scales[r * (m.cols / block) + c / block];
  const float mult = m.format == Fp4Format::NVFP4 ? e4m3_to_float(s) * m.global_scale
                                                  : float(std::ldexp(1.0, int(s) - 127));
  return e2m1_to_float(code) * mult;
}

TEST(Fp4Fixtures, DequantizeOfModelOptBytesMatchesFormula) {
  const auto& fx = fixtures();
  for (const auto& c : fx.manifest["cases"]) {
    if (c["name"] == "nvfp4_all_zero_tensor") continue;
    SCOPED_TRACE(std::string(c["name"]));
    Fp4MatrixView v;
    v.format = c["format"] == "nvfp4" ? Fp4Format::NVFP4 : Fp4Format::MXFP4;
    v.rows = c["rows"];
    v.cols = c["cols"];
    v.packed = fx.blob.data() + size_t(c["packed_offset"]);
    v.scales = fx.blob.data() + size_t(c["scales_offset"]);
    v.global_scale = from_bits(uint32_t(c["global_scale_bits"]));
    std::vector<float> out(size_t(v.rows * v.cols), std::numeric_limits<float>::quiet_NaN());
    dequantize_rows(v, 0, v.rows, out.data());
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t col = 0; col < v.cols; ++col)
        ASSERT_EQ(out[size_t(r * v.cols + col)], dequant_ref(v, r, col)) << r << "," << col;
  }
}

std::vector<float> random_normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double rel_l2(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

TEST(Fp4Quantize, RoundTripErrorIsBounded) {
  for (Fp4Format f : {Fp4Format::NVFP4, Fp4Format::MXFP4}) {
    SCOPED_TRACE(std::string(fp4_format_name(f)));
    const int64_t rows = 64, cols = 512;
    const auto w = random_normal(size_t(rows * cols), 3, 0.02f);
    const Fp4Matrix q = f == Fp4Format::NVFP4 ? quantize_nvfp4(w.data(), rows, cols) : quantize_mxfp4(w.data(), rows, cols);
    std::vector<float> out(w.size(), std::numeric_limits<float>::quiet_NaN());
    dequantize_rows(q.view(), 0, rows, out.data());
    const double err = rel_l2(out, w);
    // NVFP4 on Gaussian data lands near 0.09, MXFP4 (power-of-two scales) near 0.12.
    EXPECT_LT(err, f == Fp4Format::NVFP4 ? 0.11 : 0.15) << err;
    EXPECT_GT(err, 0.01) << err;  // it really is 4-bit
    // Per element: |w - deq| <= half the largest E2M1 step (1.0) times the block's unit,
    // plus the clip of a block max that its rounded-down scale pushed past 6 (<= 6/16).
    const int block = fp4_block_size(f);
    for (int64_t b = 0; b < rows * cols / block; ++b) {
      const float unit = f == Fp4Format::NVFP4 ? e4m3_to_float(q.scales[size_t(b)]) * q.global_scale
                                               : e8m0_to_float(q.scales[size_t(b)]);
      for (int i = 0; i < block; ++i) {
        const size_t k = size_t(b * block + i);
        ASSERT_LE(std::fabs(out[k] - w[k]), unit * 1.0f * (1 + 1e-6f)) << k;
      }
    }
  }
}

TEST(Fp4Quantize, SharedGlobalScaleIsUsed) {
  const auto w = random_normal(16 * 64, 5);
  const Fp4Matrix own = quantize_nvfp4(w.data(), 16, 64);
  const Fp4Matrix shared = quantize_nvfp4(w.data(), 16, 64, own.global_scale * 2.0f);
  EXPECT_EQ(shared.global_scale, own.global_scale * 2.0f);
  std::vector<float> a(w.size()), b(w.size());
  dequantize_rows(own.view(), 0, 16, a.data());
  dequantize_rows(shared.view(), 0, 16, b.data());
  EXPECT_LT(rel_l2(a, w), 0.11);
  EXPECT_LT(rel_l2(b, w), 0.11);
}

TEST(Fp4Quantize, BadInputThrows) {
  std::vector<float> w(4 * 48, 1.0f);
  EXPECT_THROW(quantize_nvfp4(w.data(), 4, 40), Error);  // 40 % 16 != 0
  EXPECT_THROW(quantize_mxfp4(w.data(), 4, 48), Error);  // 48 % 32 != 0
  w[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(quantize_nvfp4(w.data(), 4, 48), Error);
  w[7] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_mxfp4(w.data(), 2, 64), Error);
  w[7] = 1.0f;
  EXPECT_THROW(quantize_nvfp4(w.data(), 4, 48, -1.0f), Error);
  EXPECT_THROW(quantize_nvfp4(w.data(), 4, 48, 0.0f), Error);  // would zero a non-zero tensor
  std::vector<float> zeros(64, 0.0f);
  EXPECT_EQ(quantize_nvfp4(zeros.data(), 2, 32, 0.0f).scales, (std::vector<uint8_t>(4, 0x38)));
  const Fp4Matrix q = quantize_nvfp4(w.data(), 4, 48);
  std::vector<float> out(4 * 48);
  EXPECT_THROW(dequantize_rows(q.view(), 2, 5, out.data()), Error);
  EXPECT_THROW(dequantize_rows(q.view(), 3, 2, out.data()), Error);
}

// Random packed bytes and scales (no NaN scale codes) for the dequantize tests.
Fp4Matrix random_fp4(Fp4Format f, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp4Matrix m;
  m.format = f;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(size_t(rows * cols / 2));
  m.scales.resize(size_t(rows * cols / fp4_block_size(f)));
  for (auto& b : m.packed) b = uint8_t(rng());
  for (auto& s : m.scales) {
    s = uint8_t(rng());
    if (f == Fp4Format::NVFP4 && (s & 0x7F) == 0x7F) s = 0x38;
    if (f == Fp4Format::MXFP4) s = uint8_t(100 + s % 50);
  }
  m.global_scale = f == Fp4Format::NVFP4 ? 1.7e-3f : 1.0f;
  return m;
}

TEST(Fp4Dequantize, MatchesScalarReferenceOnEveryRowRange) {
  for (Fp4Format f : {Fp4Format::NVFP4, Fp4Format::MXFP4}) {
    SCOPED_TRACE(std::string(fp4_format_name(f)));
    const int64_t rows = 7, cols = 256;
    const Fp4Matrix m = random_fp4(f, rows, cols, 21);
    for (int64_t r0 = 0; r0 < rows; ++r0)
      for (int64_t r1 = r0; r1 <= rows; r1 += 3) {
        const int64_t n = (r1 - r0) * cols;
        std::vector<float> out(size_t(n + 64), std::numeric_limits<float>::quiet_NaN());
        std::vector<uint16_t> out16(size_t(n + 64), 0x7FC1);
        dequantize_rows(m.view(), r0, r1, out.data());
        dequantize_rows_bf16(m.view(), r0, r1, out16.data());
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const size_t k = size_t((r - r0) * cols + c);
            const float ref = dequant_ref(m.view(), r, c);
            ASSERT_EQ(bits(out[k]) & 0x7FFFFFFFu, bits(ref) & 0x7FFFFFFFu) << r << "," << c;
            ASSERT_EQ(out[k], ref);
            ASSERT_EQ(out16[k], float_to_bf16(out[k])) << r << "," << c;
          }
        for (size_t k = size_t(n); k < out.size(); ++k) {  // nothing written past the range
          ASSERT_TRUE(std::isnan(out[k]));
          ASSERT_EQ(out16[k], 0x7FC1);
        }
      }
  }
}

TEST(Fp4Dequantize, NaNScaleGivesNaN) {
  Fp4Matrix m = random_fp4(Fp4Format::NVFP4, 1, 32, 3);
  m.packed.assign(16, 0x22);  // all 1.0
  m.scales = {0x7F, 0x38};
  std::vector<float> out(32);
  std::vector<uint16_t> out16(32);
  dequantize_rows(m.view(), 0, 1, out.data());
  dequantize_rows_bf16(m.view(), 0, 1, out16.data());
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(std::isnan(out[size_t(i)]));
    EXPECT_TRUE(std::isnan(bf16_to_float(out16[size_t(i)])));
  }
  for (int i = 16; i < 32; ++i) EXPECT_EQ(out[size_t(i)], 1.0f * m.global_scale);
}

// Decode throughput (input bytes = packed + scales per second), one thread, output kept
// cache-resident as the CPU backend does (it decodes a tile of rows at a time).
TEST(Fp4Dequantize, Throughput) {
  for (Fp4Format f : {Fp4Format::NVFP4, Fp4Format::MXFP4}) {
    const int64_t rows = 4096, cols = 2048, tile = 4;  // a 2048-wide expert weight
    const Fp4Matrix m = random_fp4(f, rows, cols, 9);
    std::vector<float> out(size_t(tile * cols));
    std::vector<uint16_t> out16(size_t(tile * cols));
    const double in_bytes = double(m.packed.size() + m.scales.size());
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      double best = 1e30;
      double sink = 0;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < rows; r += tile) {
          if (bf16) {
            dequantize_rows_bf16(m.view(), r, r + tile, out16.data());
            sink += out16[size_t(r % cols)];
          } else {
            dequantize_rows(m.view(), r, r + tile, out.data());
            sink += out[size_t(r % cols)];
          }
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const double gbs = in_bytes / best / 1e9;
      std::printf("[ perf ] dequantize %s -> %s: %.2f GB/s of FP4 input (%.1f Gelem/s), 1 thread\n",
                  std::string(fp4_format_name(f)).c_str(), bf16 ? "bf16" : "f32", gbs,
                  double(rows * cols) / best / 1e9);
      RecordProperty(std::string(fp4_format_name(f)) + (bf16 ? "_bf16_GBps" : "_f32_GBps"), std::to_string(gbs));
      EXPECT_TRUE(std::isfinite(sink));
      EXPECT_GT(gbs, 0.2);  // a loose floor: catches a scalar or broken path, not noise
    }
  }
}

// Quantize throughput (input elements per second), one thread.
TEST(Fp4Quantize, Throughput) {
  const int64_t rows = 512, cols = 6144;
  const auto w = random_normal(size_t(rows * cols), 17, 0.02f);
  for (Fp4Format f : {Fp4Format::NVFP4, Fp4Format::MXFP4}) {
    double best = 1e30;
    uint8_t sink = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      const Fp4Matrix q = f == Fp4Format::NVFP4 ? quantize_nvfp4(w.data(), rows, cols) : quantize_mxfp4(w.data(), rows, cols);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      sink ^= q.packed[size_t(rep)];
    }
    std::printf("[ perf ] quantize %s: %.0f Melem/s (%.2f GB/s of FP32 input), 1 thread\n",
                std::string(fp4_format_name(f)).c_str(), double(rows * cols) / best / 1e6,
                double(rows * cols) * 4 / best / 1e9);
    EXPECT_GT(double(rows * cols) / best, 5e6);
    (void)sink;
  }
}

}  // namespace
}  // namespace fp4moe
