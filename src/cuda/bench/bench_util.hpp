// Benchmark helpers shared by the `fp4moe bench ...` commands: the two measured ceilings,
// device-side random fills, and a cold-L2 timer (median of per-iteration CUDA-event times,
// L2 flushed before every timed iteration by writing or by reading a 256 MiB buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/common/device_buffer.hpp"

namespace fp4moe::cuda::bench {

// Median of a sample (the mean of the two middle values for an even count; 0 when empty).
double median(std::vector<double> v);

struct Ceilings {
  double copy_gbps = 0;     // large D2D cudaMemcpy, bytes read + written per second / 1e9
  double bf16_tflops = 0;   // cuBLASLt BF16 8192^3 (FP32 accumulate, BF16 out), random data
  double fp8_tflops = 0;    // cuBLASLt FP8 E4M3 8192^3 (FP32 accumulate, BF16 out), random data; 0 if unsupported
  int64_t copy_bytes = 0;   // size of the copied buffer
  int gemm_size = 0;        // 8192
};
Ceilings measure_ceilings(cudaStream_t stream, int iters = 10);

// Device-side random fills (counter-based, deterministic for a seed).
void fill_random_bf16(void* p, size_t n, uint64_t seed, float stddev, cudaStream_t stream);  // ~normal
void fill_random_u8(void* p, size_t n, uint64_t seed, uint32_t lo, uint32_t hi, cudaStream_t stream);  // [lo, hi]
void fill_random_f32(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);      // uniform


// Floor kernels (floor_kernels.cu): the simplest kernels that move a stage's bytes, to be timed
// beside the stage under the same timer. move_bytes reads each span once (16-byte loads; a
// span's bytes are rounded down to 16) and writes write_bytes of zeros to dst, grid-stride over
// the whole GPU, in ONE launch; spans and dst 16-byte aligned, at most 4 spans.
struct ByteSpan {
  const void* p = nullptr;
  size_t bytes = 0;
};
void move_bytes(std::initializer_list<ByteSpan> reads, void* dst, size_t write_bytes, cudaStream_t stream);
// The same kind of read through an index list, in ONE launch: page i of each pool (a ByteSpan
// whose bytes are ONE page's, a multiple of 16) at pool + index[i] * page bytes, one warp per
// page. Over a paged cache's page table or a slot list, it reads what an attention kernel reads
// in the cache's scattered order (TLB and DRAM-page misses included), with no work on it.
void gather_pages(std::initializer_list<ByteSpan> pools, const int32_t* index, int64_t pages, cudaStream_t stream);
// One launch of an empty kernel (1 block of 32 threads): a launch's own cost in a chain.
void launch_empty(cudaStream_t stream);

// How the timer empties L2 of the timed run's data before each timed run.
//   kWrite: a memset of the flush buffer. L2 is left full of DIRTY lines, so the timed run's first
//           misses (up to the L2's size) also write those lines back: a run that reads less than
//           L2 holds pays up to twice its bytes in DRAM traffic.
//   kRead:  a kernel that reads the flush buffer. L2 is left full of clean lines (a decode step
//           meets mostly clean lines too: weights, the cache), evicted for free.
enum class L2Flush { kWrite, kRead };
// The benches' --l2-flush value ("read" or "write"); anything else is an fp4moe::Error.
L2Flush l2_flush_from(const std::string& name);

class ColdL2Timer {
 public:
  explicit ColdL2Timer(cudaStream_t stream, L2Flush flush = L2Flush::kWrite, size_t flush_bytes = size_t(256) << 20);
  ~ColdL2Timer();
  ColdL2Timer(const ColdL2Timer&) = delete;
  ColdL2Timer& operator=(const ColdL2Timer&) = delete;

  struct Result {
    double median_us = 0, min_us = 0, max_us = 0;
    int iters = 0;
  };
  // warmup untimed runs, then `iters` timed ones (fewer, down to min_iters, when one run
  // takes longer than budget_ms / iters). Each timed run follows an L2 flush.
  Result time(const std::function<void()>& fn, int iters, int warmup = 3, double budget_ms = 2000,
              int min_iters = 5);

 private:
  void flush_l2(int i);
  cudaStream_t stream_;
  DeviceBuffer flush_;
  DeviceBuffer sink_;
  L2Flush mode_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace fp4moe::cuda::bench
