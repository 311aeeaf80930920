// Weight upload for the GPU runner: host bytes (views of the mmap'd shards) stream into device
// memory through pinned staging (cuda::StagedUpload: a ring of pinned buffers that several host
// threads fill while the copies of the buffers filled before run), so no host copy of a whole
// tensor or layer is made; the MoE layers re-lay their experts into the same staging
// (staging()). Counts every byte that reaches the device (also the MoE layers' own uploads, via
// count()), shows a progress bar on a terminal (stderr) and plain lines otherwise, and reports
// GB/s with the split of the time between filling the staging and waiting for the copies.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/staged_upload.hpp"

namespace fp4moe::engine::gpu {

class Loader {
 public:
  // total_bytes: the checkpoint's bytes (the progress bar's 100 %).
  explicit Loader(size_t total_bytes);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // A device copy of `bytes` host bytes. The host bytes may go when it returns; the copy is
  // complete after finish() (or the next synchronizing call on the device).
  cuda::DeviceBuffer upload(const void* host, size_t bytes);
  // `bytes` host bytes to device address dst (as upload()).
  void upload_to(void* dst, const void* host, size_t bytes);
  // The staging every upload of the load shares (MoeCudaOptions::staging, upload_expert_gemm).
  cuda::StagedUpload& staging() { return up_; }
  // Bytes that reached the device some other way.
  void count(size_t bytes) { bytes_ += bytes; }
  // Progress: `what` is being loaded (one bar update on a terminal, a line every 10 % else).
  void progress(const std::string& what);
  void finish();  // waits for every copy; ends the progress bar

  size_t bytes() const { return bytes_; }
  double seconds() const;
  // "X GB in Y s (Z GB/s; staging filled on T threads in A s (read + re-layout), waiting for
  // copies B s)"
  std::string summary() const;

 private:
  size_t total_, bytes_ = 0;
  int last_decile_ = -1;
  bool tty_ = false;
  cuda::StagedUpload up_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace fp4moe::engine::gpu
