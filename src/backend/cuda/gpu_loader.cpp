#include "backend/cuda/gpu_loader.hpp"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace fp4moe::engine::gpu {

Loader::Loader(size_t total_bytes) : total_(total_bytes), tty_(isatty(STDERR_FILENO) != 0) {
  t0_ = std::chrono::steady_clock::now();
}

Loader::~Loader() = default;  // up_ waits for its copies

cuda::DeviceBuffer Loader::upload(const void* host, size_t bytes) {
  cuda::DeviceBuffer d(bytes);
  upload_to(d.ptr(), host, bytes);
  return d;
}

void Loader::upload_to(void* device, const void* host, size_t bytes) {
  up_.upload(device, host, bytes);
  bytes_ += bytes;
}

double Loader::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string Loader::summary() const {
  const double s = seconds();
  return fmt::format("{:.2f} GB in {:.1f} s ({:.2f} GB/s; staging filled on {} threads in {:.1f} s (read + re-layout), "
                     "waiting for copies {:.1f} s)",
                     double(bytes_) / 1e9, s, double(bytes_) / 1e9 / s, up_.threads(), up_.fill_seconds(),
                     up_.wait_seconds());
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
  up_.finish();
  if (tty_ && total_ > 0) fmt::print(stderr, "\n");
}

}  // namespace fp4moe::engine::gpu
