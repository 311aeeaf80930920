// Shared pieces of the backend-ops driver (tests/ops): random data, poison, a paged batch, the
// per-row comparison, and the error-bound constants the cases derive their tolerances from.
// Backend-agnostic: a backend B (backend_ops_test.cpp: the CUDA launch functions on the GPU;
// backend_ops_emu_test.cpp: the same kernels through tests/cuda/emu) supplies
//   B::Buf<T>        a buffer with p() -> T* (device memory, or host memory for the emulator)
//   B::up(vec)       a buffer holding a copy of a host vector
//   B::down(buf)     the buffer's contents (after the launches before it finished)
// and one static function per op with the launch function's arguments (no stream).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/paged_kv.hpp"
#include "cuda/common/device_batch.hpp"

namespace fp4moe::test::ops {

// Error-bound units. A value rounded once to BF16 (round to nearest even, 8 significant bits)
// is off by at most 2^-9 of itself; one FP32 rounding by at most 2^-24 of itself. A sum of n
// FP32 terms computed in another order (or with FMA) than the reference's FP64 sum is off by at
// most n · 2^-24 · Σ|terms| (the textbook bound; typical errors are ~√n of it).
constexpr double kBf16Rel = 1.0 / 512.0;
constexpr double kF32Rel = 1.0 / 16777216.0;

// Poison the outputs are filled with before a launch: a BF16 NaN, an FP32 NaN, an int32 no op
// writes. A value the op should have written and did not stays poison and fails the comparison.
constexpr uint16_t kPoisonBf16 = 0x7fff;
constexpr float kPoisonF32 = std::numeric_limits<float>::quiet_NaN();
constexpr int32_t kPoisonI32 = 0x7f7f7f7f;

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  float uni(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
  int32_t integer(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(g); }  // [lo, hi]
};

inline std::vector<float> rand_f32(Rng& r, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (float& x : v) x = r.uni(lo, hi);
  return v;
}
inline std::vector<uint16_t> rand_bf16(Rng& r, size_t n, float lo, float hi) {
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = float_to_bf16(r.uni(lo, hi));
  return v;
}
inline std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_float(v[i]);
  return o;
}
inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Per-row comparison: row r of `got` (cols [0, dim) at r · got_stride) against the reference's
// row (r · dim) within bound(r, ‖ref row‖₂) in the L2 norm; a NaN in a row fails it. Reports
// the first few failing rows.
inline void expect_rows_close(const std::string& what, const std::vector<float>& got, int64_t got_stride,
                              const std::vector<float>& ref, int64_t rows, int64_t dim,
                              const std::function<double(int64_t, double)>& bound) {
  int failures = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double err = 0.0, norm = 0.0;
    bool nan = false;
    for (int64_t i = 0; i < dim; ++i) {
      const double g = got[size_t(r * got_stride + i)], f = ref[size_t(r * dim + i)];
      nan = nan || std::isnan(g);
      err += (g - f) * (g - f);
      norm += f * f;
    }
    err = std::sqrt(err);
    norm = std::sqrt(norm);
    const double b = bound(r, norm);
    if (nan || !(err <= b)) {
      ADD_FAILURE() << what << ": row " << r << (nan ? " has NaN (poison left or produced)" : "") << ", |got - ref| "
                    << err << " > bound " << b << " (|ref| " << norm << ")";
      if (++failures >= 5) return;
    }
  }
}

template <typename T>
inline void expect_equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != ref[i]) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", reference " << ref[i];
      if (++failures >= 5) return;
    }
}

// A step's paged batch: request r has ctx[r] tokens of context of which the last fresh[r] are
// this step's (flat tokens in request order), pages dealt from a shuffled pool with spare pages.
struct PagedBatch {
  int32_t requests = 0, tokens = 0, page_size = 0, num_pages = 0;
  std::vector<int32_t> qo_indptr, positions, kv_len, page_indptr, page_indices, token_req;
  KvBatchView host() const {
    KvBatchView b;
    b.num_requests = requests;
    b.num_tokens = tokens;
    b.qo_indptr = qo_indptr.data();
    b.positions = positions.data();
    b.kv_len = kv_len.data();
    b.page_indptr = page_indptr.data();
    b.page_indices = page_indices.data();
    return b;
  }
};

inline PagedBatch make_batch(Rng& rng, const std::vector<int32_t>& ctx, const std::vector<int32_t>& fresh,
                             int32_t page_size) {
  PagedBatch b;
  b.requests = int32_t(ctx.size());
  b.page_size = page_size;
  int32_t pages = 0;
  for (int32_t c : ctx) pages += (c + page_size - 1) / page_size;
  b.num_pages = pages + 3;
  std::vector<int32_t> pool(size_t(b.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng.g);
  b.qo_indptr = {0};
  b.page_indptr = {0};
  size_t next = 0;
  for (int32_t r = 0; r < b.requests; ++r) {
    for (int32_t p = ctx[size_t(r)] - fresh[size_t(r)]; p < ctx[size_t(r)]; ++p) {
      b.positions.push_back(p);
      b.token_req.push_back(r);
    }
    b.qo_indptr.push_back(int32_t(b.positions.size()));
    b.kv_len.push_back(ctx[size_t(r)]);
    for (int32_t p = 0; p < (ctx[size_t(r)] + page_size - 1) / page_size; ++p) b.page_indices.push_back(pool[next++]);
    b.page_indptr.push_back(int32_t(b.page_indices.size()));
  }
  b.tokens = int32_t(b.positions.size());
  return b;
}

// The batch's arrays in backend buffers, and its cuda::DeviceBatch view over them.
template <class B>
struct BackendBatch {
  typename B::template Buf<int32_t> qo, pos, kvl, pip, pidx, treq;
  cuda::DeviceBatch view{};
  explicit BackendBatch(const PagedBatch& b)
      : qo(B::up(b.qo_indptr)), pos(B::up(b.positions)), kvl(B::up(b.kv_len)), pip(B::up(b.page_indptr)),
        pidx(B::up(b.page_indices)), treq(B::up(b.token_req)) {
    view.tokens = b.tokens;
    view.requests = b.requests;
    view.qo_indptr = qo.p();
    view.positions = pos.p();
    view.kv_len = kvl.p();
    view.page_indptr = pip.p();
    view.page_indices = pidx.p();
    view.token_req = treq.p();
    view.page_size = b.page_size;
  }
};

}  // namespace fp4moe::test::ops
