// Host → device uploads through pinned staging: a ring of pinned buffers that several host
// threads fill (a plain copy out of the mmap'd checkpoint, or a re-layout computed on the way)
// while the copies of the buffers filled before run on the device (one stream, DMA). No host
// copy of a whole tensor or layer is ever made: at most the ring (kBuffers x kChunk) is staged.
//
//   fill chunk i (threads) ─► cudaMemcpyAsync chunk i ─► event i
//   fill chunk i+1 ... i+kBuffers-1 meanwhile; chunk i+kBuffers waits for event i
//
// Counts the seconds the caller spent filling (host read + re-layout) and waiting for copies,
// so a loader can say which of the two limits it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_runtime_api.h>

namespace fp4moe::cuda {

class StagedUpload {
 public:
  static constexpr size_t kChunk = size_t(64) << 20;
  static constexpr int kBuffers = 4;
  static constexpr int kMaxThreads = 32;

  // threads: host threads filling the staging (0: fp4moe::default_num_threads(), at most
  // kMaxThreads). Pinned memory is allocated at the first upload (at most the bytes it needs,
  // up to chunk_bytes per buffer).
  explicit StagedUpload(int threads = 0, size_t chunk_bytes = kChunk, int buffers = kBuffers);
  ~StagedUpload();  // waits for the copies in flight
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // fill(i, out) writes item i's item_bytes bytes to out (pinned). Called for every i in
  // [0, items), on several threads at once, each i once.
  using Fill = std::function<void(int64_t item, uint8_t* out)>;
  // Device [dst, dst + items * item_bytes) = the items in order. Returns when every item was
  // filled (the sources can go); copies may still run (finish() waits). An exception from
  // `fill` is rethrown after the copies in flight are done.
  void upload_items(void* dst, size_t item_bytes, int64_t items, const Fill& fill);
  // Device [dst, dst + bytes) = host [src, src + bytes) (the copy into staging on the threads).
  void upload(void* dst, const void* src, size_t bytes);
  // Waits for every copy enqueued so far.
  void finish();

  int threads() const { return threads_; }
  size_t bytes() const { return bytes_; }              // bytes copied to the device so far
  double fill_seconds() const { return fill_s_; }      // filling staging (host read + re-layout)
  double wait_seconds() const { return wait_s_; }      // blocked on copies (a buffer to refill, finish)

 private:
  void reserve(size_t chunk_bytes);
  int threads_ = 1, nbuf_ = kBuffers;
  size_t max_chunk_ = kChunk, chunk_ = 0;  // chunk_: bytes of each pinned buffer allocated
  void* pinned_[kBuffers] = {};
  cudaEvent_t done_[kBuffers] = {};
  cudaStream_t stream_ = nullptr;
  int next_ = 0;  // the buffer the next chunk fills
  size_t bytes_ = 0;
  double fill_s_ = 0.0, wait_s_ = 0.0;
};

}  // namespace fp4moe::cuda
