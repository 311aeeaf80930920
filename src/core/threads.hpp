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

}  // namespace fp4moe
