#include "core/tensor.hpp"

#include <fmt/format.h>

namespace fp4moe {

std::string_view device_name(Device d) { return d == Device::Host ? "host" : "cuda"; }

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  FP4MOE_CHECK(int(shape.size()) <= kMaxDims, "tensor of {} dims (at most {})", shape.size(), kMaxDims);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    FP4MOE_CHECK(s >= 0, "negative tensor dimension {}", s);
    v.shape[size_t(i++)] = s;
  }
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[size_t(d)] = stride;
    stride *= v.shape[size_t(d)];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[size_t(d)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[size_t(d)] != 1 && strides[size_t(d)] != stride) return false;
    stride *= shape[size_t(d)];
  }
  return true;
}

TensorView TensorView::slice(int dim, int64_t begin, int64_t end) const {
  if (dim < 0) dim += ndim;
  FP4MOE_CHECK(dim >= 0 && dim < ndim, "slice of dim {} of a {}-dim tensor", dim, ndim);
  FP4MOE_CHECK(0 <= begin && begin <= end && end <= shape[size_t(dim)], "slice [{}, {}) of a dimension of {}", begin,
               end, shape[size_t(dim)]);
  TensorView v = *this;
  v.data = static_cast<uint8_t*>(data) + size_t(begin * strides[size_t(dim)]) * dtype_size(dtype);
  v.shape[size_t(dim)] = end - begin;
  return v;
}

TensorView TensorView::operator[](int64_t i) const {
  FP4MOE_CHECK(ndim >= 1 && i >= 0 && i < shape[0], "index {} of a dimension of {}", i, ndim ? shape[0] : 0);
  TensorView v = *this;
  v.data = static_cast<uint8_t*>(data) + size_t(i * strides[0]) * dtype_size(dtype);
  for (int d = 1; d < ndim; ++d) {
    v.shape[size_t(d - 1)] = shape[size_t(d)];
    v.strides[size_t(d - 1)] = strides[size_t(d)];
  }
  v.ndim = ndim - 1;
  return v;
}

TensorView TensorView::reshape(std::initializer_list<int64_t> new_shape) const {
  FP4MOE_CHECK(is_contiguous(), "reshape of a non-contiguous {}", describe());
  TensorView v = contiguous(data, dtype, new_shape, device);
  v.device_index = device_index;
  FP4MOE_CHECK(v.numel() == numel(), "reshape of {} to {} elements", describe(), v.numel());
  return v;
}

std::string TensorView::describe() const {
  std::string s = fmt::format("{}[", dtype_name(dtype));
  for (int d = 0; d < ndim; ++d) s += fmt::format("{}{}", d ? ", " : "", shape[size_t(d)]);
  return s + fmt::format("] {}", device_name(device));
}

}  // namespace fp4moe
