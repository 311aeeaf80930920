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

}  // namespace fp4moe::testing_model
