// The one RAII device allocation: one cudaMalloc, freed on destruction, movable, not
// copyable. Typed access through as<T>(); the host helpers upload / download whole arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of device memory (0: none, ptr() is null).
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_) FP4MOE_CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
  }
  // A device copy of a host vector (synchronous).
  template <typename T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    b.upload(host);
    return b;
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* ptr() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

  // Synchronous copies of whole host arrays (sizes checked against the buffer).
  template <typename T>
  void upload(const std::vector<T>& host, size_t offset_bytes = 0) {
    check_fits(host.size() * sizeof(T), offset_bytes);
    if (!host.empty())
      FP4MOE_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(ptr_) + offset_bytes, host.data(), host.size() * sizeof(T),
                                   cudaMemcpyHostToDevice));
  }
  template <typename T>
  std::vector<T> download(size_t count) const {
    check_fits(count * sizeof(T), 0);
    std::vector<T> h(count);
    if (count) FP4MOE_CUDA_CHECK(cudaMemcpy(h.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  template <typename T>
  std::vector<T> download() const { return download<T>(bytes_ / sizeof(T)); }

  void reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void check_fits(size_t bytes, size_t offset) const {
    FP4MOE_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "device buffer of {} B: {} B at offset {} do not fit",
                 bytes_, bytes, offset);
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fp4moe::cuda
