// TensorView: a non-owning view of a strided tensor (dtype, int64 shape and strides in
// elements, and the device its memory lives on). Views never allocate or free.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/bf16.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace fp4moe {

enum class Device : uint8_t { Host, Cuda };
std::string_view device_name(Device d);  // "host" | "cuda"

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

struct TensorView {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::Host;
  int device_index = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  // A contiguous row-major view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::Host);
  template <typename T>
  static TensorView of(T* data, std::initializer_list<int64_t> shape, Device device = Device::Host) {
    return contiguous(const_cast<std::remove_const_t<T>*>(data), dtype_of<std::remove_const_t<T>>(), shape, device);
  }

  int64_t size(int dim) const { return shape[size_t(dim < 0 ? dim + ndim : dim)]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;

  // Typed pointer; throws if T is not the view's dtype.
  template <typename T>
  T* ptr() const {
    FP4MOE_CHECK(dtype_of<std::remove_const_t<T>>() == dtype, "tensor is {}, accessed as {}", dtype_name(dtype),
                 dtype_name(dtype_of<std::remove_const_t<T>>()));
    return static_cast<T*>(data);
  }

  // Rows [begin, end) of dimension `dim` (same strides).
  TensorView slice(int dim, int64_t begin, int64_t end) const;
  // Index `i` of dimension 0, dropping it.
  TensorView operator[](int64_t i) const;
  // Same data, another shape (contiguous views only).
  TensorView reshape(std::initializer_list<int64_t> shape) const;

  std::string describe() const;  // e.g. "BF16[4, 8] host"
};

}  // namespace fp4moe
