// Weight upload for the GPU runner: host bytes (views of the mmap'd shards) stream into device
// memory through two pinned staging buffers (the copy of chunk i overlaps the page-in of chunk
// i + 1), so no host copy of a whole tensor is made for BF16 linears. Counts every byte that
// reaches the device (also the MoE layers' own uploads, via count()), shows a progress bar on
// a terminal (stderr) and plain lines otherwise, and reports GB/s.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

#include "cuda/common/device_buffer.hpp"

namespace fp4moe::engine::gpu {

class Loader {
 public:
  // total_bytes: the checkpoint's bytes (the progress bar's 100 %).
  explicit Loader(size_t total_bytes);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // A device copy of `bytes` host bytes (synchronous when it returns).
  cuda::DeviceBuffer upload(const void* host, size_t bytes);
  // `bytes` host bytes to device address dst (synchronous when it returns).
  void upload_to(void* dst, const void* host, size_t bytes);
  // Bytes that reached the device some other way.
  void count(size_t bytes) { bytes_ += bytes; }
  // Progress: `what` is being loaded (one bar update on a terminal, a line every 10 % else).
  void progress(const std::string& what);
  void finish();

  size_t bytes() const { return bytes_; }
  double seconds() const;
  std::string summary() const;  // "X GB in Y s (Z GB/s)"

  static constexpr size_t kChunk = size_t(64) << 20;

 private:
  size_t total_, bytes_ = 0;
  int last_decile_ = -1;
  bool tty_ = false;
  void* pinned_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace fp4moe::engine::gpu
