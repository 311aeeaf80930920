#include "engine/event_courier.hpp"

namespace fp4moe::engine {

EventCourier::EventCourier() { thread_ = std::thread([this] { run(); }); }

EventCourier::~EventCourier() { stop(); }

void EventCourier::send(std::vector<Parcel>& parcels) {
  if (parcels.empty()) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = queue_.empty();
    if (queue_.empty()) {
      queue_.swap(parcels);
    } else {
      for (auto& p : parcels) queue_.push_back(std::move(p));
    }
  }
  parcels.clear();
  if (wake) cv_.notify_one();
}

void EventCourier::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EventCourier::run() {
  std::vector<Parcel> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and everything delivered
      batch.swap(queue_);
    }
    for (auto& p : batch) p.channel->push(p.index, std::move(p.event));
    batch.clear();
  }
}

}  // namespace fp4moe::engine
