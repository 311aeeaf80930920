#pragma once
// The HTTP server's worker pool: a thread pool that starts threads as requests need them, up to
// a maximum, and lets threads idle past a timeout exit (down to a minimum). The I/O thread
// (http_server.hpp) hands it complete requests; a stream holds its worker to the end.
//
// Why it grows rather than starting all threads at once (as cpp-httplib's pool, used before,
// did): `serve` sizes the pool
// at 2 x --max-running-requests + 32 (a stream holds its thread), so a server at cap 2048 kept
// 4,128 threads, nearly all idle and all waiting on one condition variable: one futex, one hash
// bucket of the kernel's futex table. Measured (fake backend, 256 streams, 2-core dev machine):
// the engine thread's per-round host work went from ~4.3 ms to ~7.7 ms with 4,128 threads against
// 544, most of it in futex_wake and the bucket's spinlock. bench/RESULTS.md, sixth session.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

namespace fp4moe::serve {

class GrowingThreadPool {
 public:
  // max_threads >= 1; min_threads (<= max) never exit; idle threads above it exit after idle_exit.
  GrowingThreadPool(size_t max_threads, size_t min_threads, std::chrono::milliseconds idle_exit);
  ~GrowingThreadPool();
  GrowingThreadPool(const GrowingThreadPool&) = delete;
  GrowingThreadPool& operator=(const GrowingThreadPool&) = delete;

  void enqueue(std::function<void()> fn);
  // Refuses (false) when every thread is busy, none can start and max_waiting jobs already wait.
  bool try_enqueue(std::function<void()> fn, size_t max_waiting);
  void shutdown();  // runs what is queued, then joins every thread

  size_t threads() const;  // alive now
  size_t peak_threads() const;

 private:
  struct Worker {
    std::thread thread;
    bool done = false;  // set by the thread as it leaves: join it at the next start or shutdown
  };
  void run(Worker* self);
  void take_finished_locked(std::list<Worker>& out);  // moves exited workers to out, joined outside the lock

  const size_t max_, min_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::list<Worker> workers_;  // stable addresses: a worker marks its own entry done
  size_t alive_ = 0, idle_ = 0, peak_ = 0;
  bool shutdown_ = false;
};

}  // namespace fp4moe::serve
