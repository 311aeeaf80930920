#include "engine/engine.hpp"

#include "engine/event_courier.hpp"

#include <random>

#include "core/error.hpp"
#include "core/log.hpp"

namespace fp4moe::engine {

void OutputChannel::push(int32_t index, OutputEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back({index, std::move(event)});
  }
  cv_.notify_all();
}

bool OutputChannel::wait(std::vector<Item>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return false;
  for (auto& it : items_) out.push_back(std::move(it));
  items_.clear();
  return true;
}

Engine::Engine(SchedulerConfig config, Backend& backend, EngineOptions options)
    : config_(std::move(config)), options_(options), backend_(backend), seed_state_(std::random_device{}()) {
  scheduler_ = std::make_unique<Scheduler>(config_, backend_);
  backend_.init_kv(config_.num_pages, config_.page_size, scheduler_->max_step_tokens(), config_.max_running);
  published_.pages_total = config_.num_pages;
  published_.pages_free = config_.num_pages;
  last_log_ = std::chrono::steady_clock::now();
  courier_ = std::make_unique<EventCourier>();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

Engine::Submit Engine::submit(std::vector<RequestSpec> specs, std::shared_ptr<OutputChannel> channel,
                              std::vector<uint64_t>& ids) {
  ids.clear();
  if (!accepting_ || failed_) return Submit::kStopped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Submit::kStopped;
    const int64_t queued = unfinished_.load() - published_.running;
    if (options_.max_queued >= 0 && queued + int64_t(specs.size()) > options_.max_queued) return Submit::kQueueFull;
    for (size_t i = 0; i < specs.size(); ++i) {
      RequestSpec& s = specs[i];
      if (!s.sampling.has_seed) {
        seed_state_ += 0x9E3779B97F4A7C15ull;
        s.sampling.seed = std::mt19937_64(seed_state_)();
        s.sampling.has_seed = true;
      }
      const uint64_t id = next_id_++;
      ids.push_back(id);
      inbox_.push_back({id, std::move(s), channel, int32_t(i)});
    }
    unfinished_ += int64_t(specs.size());
  }
  cv_.notify_all();
  return Submit::kOk;
}

void Engine::cancel(std::span<const uint64_t> ids) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.insert(cancels_.end(), ids.begin(), ids.end());
  }
  cv_.notify_all();
}

int32_t Engine::flush_cache() {
  std::future<int32_t> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return 0;
    flushes_.emplace_back();
    done = flushes_.back().get_future();
  }
  cv_.notify_all();
  return done.get();
}

void Engine::abort_all(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_requested_ = true;
    abort_all_ = why;
  }
  cv_.notify_all();
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  accepting_ = false;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (courier_) courier_->stop();  // after the engine thread: its last events are delivered
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = published_;
  s.queued = int32_t(std::max<int64_t>(0, unfinished_.load() - s.running));
  return s;
}

bool Engine::busy() const { return unfinished_.load() > 0; }

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void Engine::publish() {
  const SchedulerStats s = scheduler_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  static_cast<SchedulerStats&>(published_) = s;
  published_.busy_seconds = busy_seconds_;
}

void Engine::log_interval() {
  if (options_.log_interval_rounds <= 0 || ++rounds_since_log_ < options_.log_interval_rounds) return;
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::max(1e-9, std::chrono::duration<double>(now - last_log_).count());
  const SchedulerStats s = scheduler_->stats();
  log_info("running {}, queued {}, gen {:.1f} tok/s, prefill {:.1f} tok/s, KV {}/{} pages used ({:.1f} %), {} cached, "
           "{} retractions",
           s.running, stats().queued, double(s.decode_tokens - last_log_stats_.decode_tokens) / dt,
           double(s.prefill_tokens - last_log_stats_.prefill_tokens) / dt, s.pages_used, s.pages_total,
           100.0 * s.pages_used / std::max(1, s.pages_total), s.pages_cached, s.retractions);
  last_log_ = now;
  last_log_stats_ = s;
  rounds_since_log_ = 0;
}

void Engine::loop() {
  // Events are delivered after the stats are published, so a client that sees its finish
  // also sees its pages freed in stats().
  // The routes are resolved here (a finish drops its route and counts as finished before its
  // event is seen); the courier thread wakes the HTTP threads.
  std::vector<std::pair<uint64_t, OutputEvent>> events;
  std::vector<EventCourier::Parcel> parcels;
  const EventSink sink = [&events](uint64_t id, OutputEvent&& ev) { events.emplace_back(id, std::move(ev)); };
  auto deliver = [&] {
    publish();
    for (auto& [id, ev] : events) {
      auto it = routes_.find(id);
      if (it == routes_.end()) continue;
      parcels.push_back({it->second.channel, it->second.index, std::move(ev)});
      if (parcels.back().event.finished) {
        routes_.erase(it);
        --unfinished_;
      }
    }
    events.clear();
    courier_->send(parcels);
  };
  std::vector<Incoming> incoming;
  std::vector<uint64_t> cancels;
  std::vector<std::promise<int32_t>> flushes;
  bool busy_before = false;
  for (;;) {
    bool stop = false, abort = false;
    std::string abort_why;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || abort_requested_ || !inbox_.empty() || !cancels_.empty() || !flushes_.empty() ||
               (!scheduler_->idle() && !failed_);
      });
      incoming.swap(inbox_);
      cancels.swap(cancels_);
      flushes.swap(flushes_);
      stop = stop_;
      abort = abort_requested_;
      abort_why = abort_all_;
      abort_requested_ = false;
    }
    const auto iteration_start = std::chrono::steady_clock::now();
    for (auto& in : incoming) {
      routes_[in.id] = {std::move(in.channel), in.index};
      const int32_t prompt_tokens = int32_t(in.spec.prompt.size());
      try {
        FP4MOE_CHECK(!failed_, "the engine failed: {}", failure());
        scheduler_->add(in.id, std::move(in.spec));
      } catch (const std::exception& e) {  // refused here rather than lost
        OutputEvent ev;
        ev.finished = true;
        ev.reason = FinishReason::kAbort;
        ev.abort_message = e.what();
        ev.usage.prompt_tokens = prompt_tokens;
        sink(in.id, std::move(ev));
      }
    }
    incoming.clear();
    for (uint64_t id : cancels) scheduler_->cancel(id, "cancelled", sink);
    cancels.clear();
    if (abort) scheduler_->cancel_all(abort_why, sink);
    if (!flushes.empty()) {
      const int32_t freed = scheduler_->flush_cache();
      publish();
      for (auto& f : flushes) f.set_value(freed);
      flushes.clear();
    }
    if (stop) {
      scheduler_->cancel_all("the server is shutting down", sink);
      deliver();
      return;
    }
    if (!failed_ && !scheduler_->idle()) {
      if (!busy_before) {  // rates in the log cover busy time only
        last_log_ = std::chrono::steady_clock::now();
        last_log_stats_ = scheduler_->stats();
        rounds_since_log_ = 0;
      }
      busy_before = true;
      try {
        scheduler_->run_round(sink);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          failure_ = e.what();
        }
        failed_ = true;
        log_warn("engine: the backend failed, serving stops: {}", e.what());
        try {
          scheduler_->cancel_all(std::string("the engine failed: ") + e.what(), sink);
        } catch (const std::exception& e2) {
          log_warn("engine: cleaning up after the failure: {}", e2.what());
        }
      }
      log_interval();
    } else {
      busy_before = false;
    }
    deliver();
    if (busy_before)
      busy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - iteration_start).count();
  }
}

}  // namespace fp4moe::engine
