// One host thread that runs a job while its owner does something else: the scheduler fills a
// step's grammar masks on it while the backend runs the forward (the masks are needed only by
// the sampler). start() hands it a job; wait() blocks until the job is done and rethrows what
// it threw (every later wait() returns at once). Not copyable; the destructor waits and stops.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace fp4moe::engine {

class MaskFiller {
 public:
  MaskFiller() : thread_([this] { loop(); }) {}
  ~MaskFiller() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !busy_; });
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  MaskFiller(const MaskFiller&) = delete;
  MaskFiller& operator=(const MaskFiller&) = delete;

  // The previous job must have been waited for.
  void start(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      error_ = nullptr;
      busy_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (busy_ && job_); });
      if (stop_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the fields it reads
};

}  // namespace fp4moe::engine
