#include "serve/http_task_queue.hpp"

#include <cstdint>

#include "core/error.hpp"

namespace fp4moe::serve {

GrowingThreadPool::GrowingThreadPool(size_t max_threads, size_t min_threads, std::chrono::milliseconds idle_exit)
    : max_(max_threads), min_(std::min(min_threads, max_threads)), idle_exit_(idle_exit) {
  FP4MOE_CHECK(max_threads >= 1, "HTTP thread pool: at least one thread (got {})", max_threads);
}

GrowingThreadPool::~GrowingThreadPool() { shutdown(); }

void GrowingThreadPool::take_finished_locked(std::list<Worker>& out) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    auto next = std::next(it);
    if (it->done) out.splice(out.end(), workers_, it);
    it = next;
  }
}

void GrowingThreadPool::enqueue(std::function<void()> fn) { try_enqueue(std::move(fn), SIZE_MAX); }

bool GrowingThreadPool::try_enqueue(std::function<void()> fn, size_t max_waiting) {
  std::list<Worker> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (alive_ >= max_ && jobs_.size() >= idle_ && jobs_.size() - idle_ >= max_waiting) return false;
    jobs_.push_back(std::move(fn));
    take_finished_locked(finished);
    // A new thread when every live one is busy (or already claimed by a queued job).
    if (!shutdown_ && idle_ < jobs_.size() && alive_ < max_) {
      Worker& w = workers_.emplace_back();
      ++alive_;
      peak_ = std::max(peak_, alive_);
      w.thread = std::thread([this, p = &w] { run(p); });
    }
  }
  cv_.notify_one();
  for (Worker& w : finished) w.thread.join();  // already returned: no wait
  return true;
}

void GrowingThreadPool::run(Worker* self) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    const bool woke = cv_.wait_for(lock, idle_exit_, [&] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (jobs_.empty()) {
      if (shutdown_ || (!woke && alive_ > min_)) break;
      continue;
    }
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
  --alive_;
  self->done = true;
}

void GrowingThreadPool::shutdown() {
  std::list<Worker> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    all.splice(all.end(), workers_);
  }
  cv_.notify_all();
  for (Worker& w : all)
    if (w.thread.joinable()) w.thread.join();
}

size_t GrowingThreadPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return alive_;
}

size_t GrowingThreadPool::peak_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

}  // namespace fp4moe::serve
