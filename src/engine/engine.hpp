// The engine thread: owns the Scheduler (running batch, KV pages) and drives the Backend.
// HTTP threads hand requests over through submit() and get their tokens back on an
// OutputChannel; cancel() and flush_cache() are queued the same way and take effect within
// one round. Nothing here knows JSON.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/backend.hpp"
#include "engine/request.hpp"
#include "engine/scheduler.hpp"

namespace fp4moe::engine {

// Where one HTTP request's choices deliver their events (index = the choice).
class OutputChannel {
 public:
  struct Item {
    int32_t index = 0;
    OutputEvent event;
  };
  void push(int32_t index, OutputEvent event);
  // Moves every queued item into out; waits up to timeout when there is none. False: none came.
  bool wait(std::vector<Item>& out, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
};

class EventCourier;

struct EngineOptions {
  int32_t max_queued = -1;          // --max-queued-requests; -1: unlimited
  int32_t log_interval_rounds = 40; // one log line per this many busy rounds; 0: none
};

struct EngineStats : SchedulerStats {
  int32_t queued = 0;  // waiting in the scheduler plus handed over and not yet seen by the engine thread
  // Wall time of the engine thread's busy iterations: admitting, the round (backend_seconds
  // included) and handing its events to the courier thread. busy - backend = the host's share.
  double busy_seconds = 0;
};

class Engine {
 public:
  // Allocates the backend's KV pool (Backend::init_kv) and starts the engine thread.
  Engine(SchedulerConfig config, Backend& backend, EngineOptions options);
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  enum class Submit { kOk, kQueueFull, kStopped };
  // Queues the choices of one HTTP request (all or none); events come on channel with index
  // = position in specs. A spec without a seed gets one here. ids receives the request ids.
  Submit submit(std::vector<RequestSpec> specs, std::shared_ptr<OutputChannel> channel, std::vector<uint64_t>& ids);
  // Aborts these requests (finish reason abort) within one round; unknown ids are ignored.
  void cancel(std::span<const uint64_t> ids);
  // Frees every page only the prefix cache holds; waits for the engine thread.
  int32_t flush_cache();
  // Refuses new requests from now on (kStopped).
  void stop_accepting() { accepting_ = false; }
  // Aborts everything queued or running.
  void abort_all(const std::string& why);
  // Stops the thread; what is left is aborted.
  void shutdown();

  EngineStats stats() const;
  bool busy() const;                        // anything queued or running
  bool failed() const { return failed_; }   // the backend threw: the engine serves no more
  std::string failure() const;
  const SchedulerConfig& config() const { return config_; }

 private:
  struct Incoming {
    uint64_t id;
    RequestSpec spec;
    std::shared_ptr<OutputChannel> channel;
    int32_t index;
  };
  struct Route {
    std::shared_ptr<OutputChannel> channel;
    int32_t index;
  };
  void loop();
  void publish();
  void log_interval();

  SchedulerConfig config_;
  EngineOptions options_;
  Backend& backend_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<uint64_t, Route> routes_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Incoming> inbox_;
  std::vector<uint64_t> cancels_;
  std::vector<std::promise<int32_t>> flushes_;
  std::string abort_all_;
  bool abort_requested_ = false;
  bool stop_ = false;
  uint64_t next_id_ = 1;
  uint64_t seed_state_;
  EngineStats published_;

  std::atomic<bool> accepting_{true};
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::atomic<int64_t> unfinished_{0};
  std::chrono::steady_clock::time_point last_log_;
  SchedulerStats last_log_stats_;
  int64_t rounds_since_log_ = 0;
  double busy_seconds_ = 0;  // engine thread; published with the scheduler's stats
  std::unique_ptr<EventCourier> courier_;  // pushes each round's events into their channels
  std::thread thread_;
};

}  // namespace fp4moe::engine
