// A fixed pool of worker threads and a blocking parallel_for over [0, n).
#pragma once

#include <cstdint>
#include <functional>

namespace fp4moe {

// Number of threads the CPU backend uses (FP4MOE_THREADS or hardware concurrency).
int default_num_threads();

// Runs fn(begin, end) over chunks of [0, n) on up to `threads` threads (the caller
// takes part) and returns when all are done. The first exception thrown by fn is
// rethrown on the caller. Chunks are at least `grain` long. Not reentrant from
// inside fn (nested calls run serially).
void parallel_for(int64_t n, int threads, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& fn);

// A grain that gives each chunk at least `min_work` units when one item costs `item_work`
// (e.g. multiply-adds): small problems then run on the caller alone, without waking workers.
inline int64_t grain_for(int64_t item_work, int64_t min_work = int64_t(1) << 16) {
  return item_work >= min_work ? 1 : (min_work + item_work - 1) / (item_work > 0 ? item_work : 1);
}

}  // namespace fp4moe
