// serve/http_task_queue: the HTTP thread pool starts threads only as jobs need them, never more
// than its maximum, lets idle threads above its minimum exit, and runs every queued job.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "serve/http_task_queue.hpp"

namespace fp4moe::serve {
namespace {

using namespace std::chrono_literals;

// Jobs that block until released; counts how many run at once.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int running = 0, most = 0, finished = 0;

  std::function<void()> job() {
    return [this] {
      std::unique_lock<std::mutex> lock(mu);
      ++running;
      most = std::max(most, running);
      cv.notify_all();
      cv.wait(lock, [&] { return open; });
      --running;
      ++finished;
      cv.notify_all();
    };
  }
  bool wait_running(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 5s, [&] { return running == n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  bool wait_finished(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 5s, [&] { return finished == n; });
  }
};

bool eventually(const std::function<bool()>& f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

TEST(GrowingThreadPool, StartsNoThreadBeforeAJobAndOnePerConcurrentJob) {
  GrowingThreadPool pool(64, 4, 10s);
  EXPECT_EQ(pool.threads(), 0u);
  Gate g;
  for (int i = 0; i < 3; ++i) pool.enqueue(g.job());
  ASSERT_TRUE(g.wait_running(3));
  EXPECT_EQ(pool.threads(), 3u);
  EXPECT_EQ(pool.peak_threads(), 3u);
  g.release();
  ASSERT_TRUE(g.wait_finished(3));
  pool.shutdown();
}

TEST(GrowingThreadPool, JobsBeyondTheMaximumWaitForAFreeThread) {
  GrowingThreadPool pool(2, 1, 10s);
  Gate g;
  for (int i = 0; i < 5; ++i) pool.enqueue(g.job());
  ASSERT_TRUE(g.wait_running(2));
  std::this_thread::sleep_for(50ms);
  {
    std::lock_guard<std::mutex> lock(g.mu);
    EXPECT_EQ(g.running, 2);
    EXPECT_EQ(g.finished, 0);
  }
  g.release();
  ASSERT_TRUE(g.wait_finished(5));
  EXPECT_EQ(g.most, 2);
  EXPECT_EQ(pool.peak_threads(), 2u);
  pool.shutdown();
}

TEST(GrowingThreadPool, IdleThreadsAboveTheMinimumExitAndNewJobsStillRun) {
  GrowingThreadPool pool(16, 2, 50ms);
  Gate g;
  for (int i = 0; i < 6; ++i) pool.enqueue(g.job());
  ASSERT_TRUE(g.wait_running(6));
  g.release();
  ASSERT_TRUE(g.wait_finished(6));
  EXPECT_TRUE(eventually([&] { return pool.threads() == 2; })) << pool.threads() << " threads alive";
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i) pool.enqueue([&] { ++ran; });
  EXPECT_TRUE(eventually([&] { return ran == 4; }));
  pool.shutdown();
}

TEST(GrowingThreadPool, ShutdownRunsWhatIsQueuedAndJoins) {
  std::atomic<int> ran{0};
  {
    GrowingThreadPool pool(1, 1, 10s);
    Gate g;
    pool.enqueue(g.job());
    ASSERT_TRUE(g.wait_running(1));
    for (int i = 0; i < 3; ++i) pool.enqueue([&] { ++ran; });
    std::thread opener([&] {
      std::this_thread::sleep_for(20ms);
      g.release();
    });
    pool.shutdown();  // waits for the blocked job, then the three queued ones
    opener.join();
    EXPECT_EQ(ran, 3);
  }  // the destructor's second shutdown is a no-op
  EXPECT_EQ(ran, 3);
}

}  // namespace
}  // namespace fp4moe::serve
