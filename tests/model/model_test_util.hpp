// Helpers of the model tests: the golden folders (tests/model/golden/<case>/, written by
// tools/oracle/make_goldens.py), reading their tensors, and error measures.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/safetensors.hpp"

namespace fp4moe::testing_model {

inline std::string golden_dir(const std::string& name) {
  return std::string(FP4MOE_SOURCE_DIR) + "/tests/model/golden/" + name;
}

template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name, std::vector<int64_t>* shape = nullptr) {
  const TensorInfo& t = f.get(name);
  const auto b = f.bytes(t);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  if (shape) *shape = t.shape;
  return v;
}

// ‖a − b‖ / ‖b‖ over n values.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

// Gap between the best and the second-best value.
inline float top2_margin(const float* x, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  return a - b;
}

// The top-2 margin below which two computations of one logits row may disagree on the greedy
// token through rounding alone. a and b are the two rows (b the reference); their difference's RMS
// over the vocabulary, sigma, is the row's measured noise. A flip needs the difference of the two
// leading tokens' errors, (d_top1 - d_top2), to exceed the margin; that difference has a standard
// deviation of sqrt(2) sigma for independent errors, so 8 sigma is ~5.7 of its standard deviations
// (and above the largest single-entry error over a 155K vocabulary, ~4.5 sigma, twice). Rows whose
// reference margin exceeds this must agree; the rest are near ties.
inline float noise_margin(const float* a, const float* b, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return float(8.0 * std::sqrt(ss / double(std::max<int64_t>(n, 1))));
}

}  // namespace fp4moe::testing_model
