#include "engine/gpu/gpu_loader.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "cuda/common/cuda_check.hpp"

namespace fp4moe::engine::gpu {

Loader::Loader(size_t total_bytes) : total_(total_bytes), tty_(isatty(STDERR_FILENO) != 0) {
  for (int i = 0; i < 2; ++i) {
    FP4MOE_CUDA_CHECK(cudaMallocHost(&pinned_[i], kChunk));
    FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
  }
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  t0_ = std::chrono::steady_clock::now();
}

Loader::~Loader() {
  if (stream_) cudaStreamSynchronize(stream_), cudaStreamDestroy(stream_);
  for (int i = 0; i < 2; ++i) {
    if (done_[i]) cudaEventDestroy(done_[i]);
    if (pinned_[i]) cudaFreeHost(pinned_[i]);
  }
}

cuda::DeviceBuffer Loader::upload(const void* host, size_t bytes) {
  cuda::DeviceBuffer d(bytes);
  upload_to(d.ptr(), host, bytes);
  return d;
}

void Loader::upload_to(void* device, const void* host, size_t bytes) {
  const auto* src = static_cast<const uint8_t*>(host);
  auto* dst = static_cast<uint8_t*>(device);
  for (size_t off = 0, i = 0; off < bytes; off += kChunk, ++i) {
    const size_t n = std::min(kChunk, bytes - off);
    const int b = int(i % 2);
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(done_[b]));  // the copy that last used this buffer is done
    std::memcpy(pinned_[b], src + off, n);               // pages the shard in
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(dst + off, pinned_[b], n, cudaMemcpyHostToDevice, stream_));
    FP4MOE_CUDA_CHECK(cudaEventRecord(done_[b], stream_));
  }
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  bytes_ += bytes;
}

double Loader::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string Loader::summary() const {
  const double s = seconds();
  return fmt::format("{:.2f} GB in {:.1f} s ({:.2f} GB/s)", double(bytes_) / 1e9, s, double(bytes_) / 1e9 / s);
}

void Loader::progress(const std::string& what) {
  if (total_ == 0) return;  // quiet
  const double f = total_ ? std::min(1.0, double(bytes_) / double(total_)) : 1.0;
  if (tty_) {
    const int w = 30, fill = int(f * w);
    fmt::print(stderr, "\rloading [{}{}] {:3.0f}% {:.2f} GB {:<32}", std::string(size_t(fill), '#'),
               std::string(size_t(w - fill), ' '), f * 100, double(bytes_) / 1e9, what.substr(0, 32));
    std::fflush(stderr);
    return;
  }
  const int decile = int(f * 10);
  if (decile != last_decile_) {
    last_decile_ = decile;
    fmt::print(stderr, "loading: {:.0f}% ({:.2f} GB, {})\n", f * 100, double(bytes_) / 1e9, what);
  }
}

void Loader::finish() {
  if (tty_ && total_ > 0) fmt::print(stderr, "\n");
}

}  // namespace fp4moe::engine::gpu
