// The floor kernels: the simplest kernels that move a stage's bytes, timed by the benches under
// the same cold-L2 timer as the stage itself. A large copy gives the bandwidth ceiling; these
// give what that bandwidth buys at a stage's size (contiguous, and through a paged cache's
// scattered pages), and what a chain of N dependent launches costs before any kernel works.
#include "cuda/bench/bench_util.hpp"

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe::cuda::bench {
namespace {

constexpr int kMaxSpans = 4;
constexpr int kThreads = 256;

struct Spans {
  const uint4* p[kMaxSpans];
  size_t words[kMaxSpans];
  int n;
};

struct PagedPools {
  const uint4* p[2];
  int words[2];  // 16-byte words per page
  int n;
};

__device__ uint32_t g_floor_sink;

// Reads every 16-byte word of the spans and writes `write_words` zero words to dst, both
// grid-stride over the whole GPU. The xor of the reads is stored only when it equals a constant,
// which keeps every load without a store per thread.
__global__ void move_bytes_kernel(Spans spans, uint4* dst, size_t write_words) {
  const size_t stride = size_t(gridDim.x) * blockDim.x, first = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint32_t acc = 0;
  for (int s = 0; s < spans.n; ++s)
    for (size_t i = first; i < spans.words[s]; i += stride) {
      const uint4 v = spans.p[s][i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  for (size_t i = first; i < write_words; i += stride) dst[i] = make_uint4(0, 0, 0, 0);
  if (acc == 0x9E3779B9u) g_floor_sink = acc;
}

// One warp per page: page i of each pool lies at pool + index[i] * page bytes; the lanes read
// its 16-byte words, four loads in flight each.
__global__ void gather_pages_kernel(PagedPools pools, const int32_t* index, int64_t pages) {
  const int lane = int(threadIdx.x & 31);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x / 32) + (threadIdx.x >> 5); i < pages; i += warps) {
    const int64_t at = index[i];
    for (int s = 0; s < pools.n; ++s) {
      const uint4* page = pools.p[s] + at * int64_t(pools.words[s]);
#pragma unroll 4
      for (int w = lane; w < pools.words[s]; w += 32) {
        const uint4 v = page[w];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
  }
  if (acc == 0x9E3779B9u) g_floor_sink = acc;
}

__global__ void empty_kernel() {}

}  // namespace

void move_bytes(std::initializer_list<ByteSpan> reads, void* dst, size_t write_bytes, cudaStream_t s) {
  FP4MOE_CHECK(reads.size() <= size_t(kMaxSpans), "move_bytes: at most {} read spans", kMaxSpans);
  FP4MOE_CHECK(write_bytes == 0 || dst != nullptr, "move_bytes: {} bytes to write and no destination", write_bytes);
  Spans sp{};
  for (const ByteSpan& r : reads) {
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(r.p) % 16 == 0, "move_bytes: a read span is not 16-byte aligned");
    sp.p[sp.n] = static_cast<const uint4*>(r.p);
    sp.words[sp.n++] = r.bytes / 16;
  }
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(dst) % 16 == 0, "move_bytes: the destination is not 16-byte aligned");
  const unsigned blocks = unsigned(current_device().sm_count) * 8;
  move_bytes_kernel<<<blocks, kThreads, 0, s>>>(sp, static_cast<uint4*>(dst), write_bytes / 16);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void gather_pages(std::initializer_list<ByteSpan> pools, const int32_t* index, int64_t pages, cudaStream_t s) {
  FP4MOE_CHECK(pools.size() >= 1 && pools.size() <= 2, "gather_pages: one or two pools");
  PagedPools pp{};
  for (const ByteSpan& pool : pools) {
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(pool.p) % 16 == 0 && pool.bytes % 16 == 0 && pool.bytes > 0 &&
                     pool.bytes <= (size_t(1) << 30),
                 "gather_pages: a pool must be 16-byte aligned, its page bytes ({}) a multiple of 16 in (0, 1 GiB]",
                 pool.bytes);
    pp.p[pp.n] = static_cast<const uint4*>(pool.p);
    pp.words[pp.n++] = int(pool.bytes / 16);
  }
  FP4MOE_CHECK(pages >= 0 && (pages == 0 || index != nullptr), "gather_pages: {} pages and no index", pages);
  if (pages == 0) return;
  const unsigned blocks = unsigned(current_device().sm_count) * 8;
  gather_pages_kernel<<<blocks, kThreads, 0, s>>>(pp, index, pages);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void launch_empty(cudaStream_t s) {
  empty_kernel<<<1, 32, 0, s>>>();
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::bench
