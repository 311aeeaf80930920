// CUDA-free helpers of the attention / indexer tests (also usable by the emulator tests,
// tests/cuda/*_emu_test.cpp): a random paged batch (pages shuffled in the pool, unused pages
// between them), its host cache filled by the CPU backend's kv_append_cpu, and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/bf16.hpp"
#include "core/paged_kv.hpp"
#include "cpu/attention/kv_cache_cpu.hpp"
#include "cuda/attention/kv_dims.hpp"

namespace fp4moe::test {

using cuda::attention::kCkvDim;
using cuda::attention::kIndexDim;
using cuda::attention::kIndexHeads;
using cuda::attention::kKpeDim;

// BF16 values (as uint16) and the same values as floats.
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> f;
};
inline Bf16Data random_bf16(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  Bf16Data out;
  out.bits.resize(n);
  out.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out.bits[i] = float_to_bf16(d(g));
    out.f[i] = bf16_to_float(out.bits[i]);
  }
  return out;
}

// The indexer query's interleaved RoPE as a separate RoPE launch stores it (what the score
// kernel's fused prologue must reproduce): pair (2i, 2i + 1) of the first 2 * inv_freq.size()
// dims of every head of token t rotated in FP32 by inv_freq[i] * positions[t], cos / sin times
// attn_factor, each value rounded to BF16. q: [T, kIndexHeads, kIndexDim].
inline void rope_index_queries_like_a_launch(std::vector<float>& q, const std::vector<int32_t>& positions,
                                             const std::vector<float>& inv_freq, float attn_factor) {
  for (size_t t = 0; t < positions.size(); ++t)
    for (int h = 0; h < kIndexHeads; ++h)
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        float* v = &q[(t * kIndexHeads + size_t(h)) * kIndexDim + 2 * i];
        const float a = inv_freq[i] * float(positions[t]);
        const float co = std::cos(a) * attn_factor, sn = std::sin(a) * attn_factor, x0 = v[0], x1 = v[1];
        v[0] = round_to_bf16(x0 * co - x1 * sn);
        v[1] = round_to_bf16(x1 * co + x0 * sn);
      }
}

struct RequestShape {
  int32_t kv_len = 0;  // cached tokens once this step's tokens are in
  int32_t q_len = 0;   // this step's tokens: the last q_len positions
};

// One layer's paged cache and one step's batch, on the host.
struct PagedCase {
  int64_t page_size = 64, num_pages = 0;
  KvElem elem = KvElem::BF16, index_elem = KvElem::BF16;
  float ckv_scale = 1.f, kpe_scale = 1.f, index_scale = 1.f;
  std::vector<int32_t> qo_indptr, positions, kv_len, page_indptr, page_indices;
  std::vector<uint8_t> ckv, kpe, index_k;  // the pool's bytes

  KvBatchView batch() const {
    return {int64_t(kv_len.size()), int64_t(positions.size()), qo_indptr.data(), positions.data(),
            kv_len.data(),          page_indptr.data(),       page_indices.data()};
  }
  KvLayerView layer() {
    KvLayerView L;
    L.ckv = ckv.data();
    L.kpe = kpe.data();
    L.index_k = index_k.data();
    L.num_pages = num_pages;
    L.page_size = page_size;
    L.ckv_dim = kCkvDim;
    L.kpe_dim = kKpeDim;
    L.index_dim = kIndexDim;
    L.elem = elem;
    L.index_elem = index_elem;
    L.ckv_scale = ckv_scale;
    L.kpe_scale = kpe_scale;
    L.index_scale = index_scale;
    return L;
  }
  int max_ctx() const { return positions.empty() ? 0 : *std::max_element(positions.begin(), positions.end()) + 1; }
  int64_t tokens() const { return int64_t(positions.size()); }
};

// The batch of `shapes` with pages shuffled over a pool with spare pages; the cache holds random
// BF16-rounded values (std 1 for ckv / kpe, 1 for the index keys) at every position < kv_len,
// written by kv_append_cpu; the rest of the pool is 0xFF bytes.
inline PagedCase make_paged_case(const std::vector<RequestShape>& shapes, int64_t page_size, KvElem elem,
                                 KvElem index_elem, uint64_t seed, bool fill = true) {
  PagedCase c;
  c.page_size = page_size;
  c.elem = elem;
  c.index_elem = index_elem;
  if (elem == KvElem::FP8_E4M3) c.ckv_scale = c.kpe_scale = 1.0f / 64;  // |x| <= ~5 -> codes <= ~320
  if (index_elem == KvElem::FP8_E4M3) c.index_scale = 1.0f / 64;
  std::mt19937_64 g(seed);
  int64_t need = 0;
  for (const auto& s : shapes) need += (s.kv_len + page_size - 1) / page_size;
  c.num_pages = need + need / 4 + 3;
  std::vector<int32_t> pool(size_t(c.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), g);
  c.qo_indptr = {0};
  c.page_indptr = {0};
  size_t next = 0;
  for (const auto& s : shapes) {
    const int64_t pages = (s.kv_len + page_size - 1) / page_size;
    for (int64_t i = 0; i < pages; ++i) c.page_indices.push_back(pool[next++]);
    c.page_indptr.push_back(int32_t(c.page_indices.size()));
    for (int32_t j = 0; j < s.q_len; ++j) c.positions.push_back(s.kv_len - s.q_len + j);
    c.qo_indptr.push_back(int32_t(c.positions.size()));
    c.kv_len.push_back(s.kv_len);
  }
  const size_t slots = size_t(c.num_pages * page_size);
  c.ckv.assign(slots * kCkvDim * kv_elem_size(elem), 0xFF);
  c.kpe.assign(slots * kKpeDim * kv_elem_size(elem), 0xFF);
  c.index_k.assign(slots * kIndexDim * kv_elem_size(index_elem), 0xFF);
  if (!fill) return c;
  // Every cached position as one token of a fill batch with the same page tables.
  std::vector<int32_t> fq = {0}, fpos;
  for (const auto& s : shapes) {
    for (int32_t p = 0; p < s.kv_len; ++p) fpos.push_back(p);
    fq.push_back(int32_t(fpos.size()));
  }
  const size_t n = fpos.size();
  const auto ckv = random_bf16(n * kCkvDim, seed + 1), kpe = random_bf16(n * kKpeDim, seed + 2),
             ik = random_bf16(n * kIndexDim, seed + 3);
  KvBatchView fb{int64_t(shapes.size()), int64_t(n), fq.data(), fpos.data(), c.kv_len.data(), c.page_indptr.data(),
                 c.page_indices.data()};
  cpu::kv_append_cpu(c.layer(), fb, ckv.f.data(), kpe.f.data(), ik.f.data());
  return c;
}

// ‖a − b‖ / ‖b‖ over rows of `width`, the worst row (NaN -> +inf).
inline double worst_row_rel_error(const std::vector<float>& a, const std::vector<float>& b, size_t width) {
  double worst = 0;
  for (size_t r = 0; r * width < b.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = r * width; i < (r + 1) * width; ++i) {
      if (!std::isfinite(a[i])) return INFINITY;
      num += double(a[i] - b[i]) * double(a[i] - b[i]);
      den += double(b[i]) * double(b[i]);
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// max |a · a_scale − b| (a NaN / inf -> +inf): LSE rows (a_scale ln 2 for a base-2 LSE).
inline double worst_lse_error(const std::vector<float>& a, const std::vector<float>& b, double a_scale = 1.0) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    worst = std::max(worst, std::fabs(a[i] * a_scale - b[i]));
  }
  return worst;
}

inline std::vector<float> bf16_to_floats(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

}  // namespace fp4moe::test
