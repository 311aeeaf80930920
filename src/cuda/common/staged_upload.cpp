#include "cuda/common/staged_upload.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr size_t kPiece = size_t(1) << 20;  // upload(): bytes each thread copies at a time

}  // namespace

StagedUpload::StagedUpload(int threads, size_t chunk_bytes, int buffers)
    : threads_(std::clamp(threads > 0 ? threads : default_num_threads(), 1, kMaxThreads)),
      nbuf_(std::clamp(buffers, 2, kBuffers)),
      max_chunk_(std::max<size_t>(chunk_bytes, kPiece)) {
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (int i = 0; i < nbuf_; ++i) FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
}

StagedUpload::~StagedUpload() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (int i = 0; i < nbuf_; ++i) {
    if (done_[i]) cudaEventDestroy(done_[i]);
    if (pinned_[i]) cudaFreeHost(pinned_[i]);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

void StagedUpload::reserve(size_t bytes) {
  if (bytes <= chunk_) return;
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (int i = 0; i < nbuf_; ++i) {
    if (pinned_[i]) FP4MOE_CUDA_CHECK(cudaFreeHost(pinned_[i]));
    pinned_[i] = nullptr;
  }
  chunk_ = 0;
  for (int i = 0; i < nbuf_; ++i) FP4MOE_CUDA_CHECK(cudaMallocHost(&pinned_[i], bytes));
  chunk_ = bytes;
}

void StagedUpload::upload_items(void* dst, size_t item_bytes, int64_t items, const Fill& fill) {
  if (items <= 0 || item_bytes == 0) return;
  // Items per buffer: as many as fit one chunk (at least one: a larger item gets a larger buffer).
  const int64_t per = std::max<int64_t>(1, int64_t(max_chunk_ / item_bytes));
  reserve(size_t(std::min(per, items)) * item_bytes);
  auto* d = static_cast<uint8_t*>(dst);
  try {
    for (int64_t i0 = 0; i0 < items; i0 += per) {
      const int64_t n = std::min(per, items - i0);
      const int b = next_;
      next_ = (next_ + 1) % nbuf_;
      auto t0 = std::chrono::steady_clock::now();
      FP4MOE_CUDA_CHECK(cudaEventSynchronize(done_[b]));  // the copy that last read this buffer is done
      wait_s_ += since(t0);
      t0 = std::chrono::steady_clock::now();
      auto* out = static_cast<uint8_t*>(pinned_[b]);
      parallel_for(n, threads_, 1, [&](int64_t a, int64_t e) {
        for (int64_t i = a; i < e; ++i) fill(i0 + i, out + size_t(i) * item_bytes);
      });
      fill_s_ += since(t0);
      const size_t bytes = size_t(n) * item_bytes;
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d + size_t(i0) * item_bytes, out, bytes, cudaMemcpyHostToDevice, stream_));
      FP4MOE_CUDA_CHECK(cudaEventRecord(done_[b], stream_));
      bytes_ += bytes;
    }
  } catch (...) {
    cudaStreamSynchronize(stream_);  // nothing may still read the staging or write dst
    throw;
  }
}

void StagedUpload::upload(void* dst, const void* src, size_t bytes) {
  const auto* s = static_cast<const uint8_t*>(src);
  const size_t whole = bytes / kPiece, tail = bytes % kPiece;
  upload_items(dst, kPiece, int64_t(whole),
               [&](int64_t i, uint8_t* out) { std::memcpy(out, s + size_t(i) * kPiece, kPiece); });
  if (tail)
    upload_items(static_cast<uint8_t*>(dst) + whole * kPiece, tail, 1,
                 [&](int64_t, uint8_t* out) { std::memcpy(out, s + whole * kPiece, tail); });
}

void StagedUpload::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  wait_s_ += since(t0);
}

}  // namespace fp4moe::cuda
