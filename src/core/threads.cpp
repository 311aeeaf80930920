#include "core/threads.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fp4moe {

int default_num_threads() {
  if (const char* s = std::getenv("FP4MOE_THREADS")) {
    int v = std::atoi(s);
    if (v > 0) return v;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

// Persistent pool: workers wait for a job generation, grab chunks with an atomic counter.
class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  void run(int64_t n, int threads, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> job_lock(job_mu_);  // one parallel_for at a time
    grow(threads - 1);
    const int64_t chunks_wanted = int64_t(threads) * 4;
    const int64_t chunk = std::max<int64_t>(grain, (n + chunks_wanted - 1) / chunks_wanted);
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      chunk_ = chunk;
      next_.store(0);
      error_ = nullptr;
      active_ = std::min<int>(threads - 1, int(workers_.size()));
      pending_ = active_;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void grow(int want) {
    while (int(workers_.size()) < want) {
      int id = int(workers_.size());
      workers_.emplace_back([this, id] { loop(id); });
    }
  }

  void work() {
    for (;;) {
      int64_t begin = next_.fetch_add(chunk_);
      if (begin >= n_) break;
      int64_t end = std::min(n_, begin + chunk_);
      try {
        (*fn_)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);
      }
    }
  }

  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (id >= active_) continue;
      }
      work();
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex job_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  int active_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

thread_local bool t_inside_parallel = false;

}  // namespace

void parallel_for(int64_t n, int threads, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (threads <= 1 || n <= grain || t_inside_parallel) {
    fn(0, n);
    return;
  }
  auto wrapped = [&](int64_t b, int64_t e) {
    t_inside_parallel = true;
    try {
      fn(b, e);
    } catch (...) {
      t_inside_parallel = false;
      throw;
    }
    t_inside_parallel = false;
  };
  Pool::instance().run(n, threads, grain, wrapped);
}

}  // namespace fp4moe
