// Hands a round's output events to their HTTP threads from a thread of its own.
//
// Each event wakes the thread that streams its request (a futex wake per running request per
// round: ~1,000–2,000 of them at the largest caps). Done on the engine thread, that is host time
// between two device steps; here it overlaps the next round. Order is kept: batches are
// delivered in the order they were sent, events within a batch in their order.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.hpp"

namespace fp4moe::engine {

class EventCourier {
 public:
  struct Parcel {
    std::shared_ptr<OutputChannel> channel;
    int32_t index = 0;
    OutputEvent event;
  };
  EventCourier();
  ~EventCourier();  // stop()
  EventCourier(const EventCourier&) = delete;
  EventCourier& operator=(const EventCourier&) = delete;

  // Takes the parcels (parcels is left empty) and wakes the courier once.
  void send(std::vector<Parcel>& parcels);
  // Delivers everything sent so far, then ends the thread. Idempotent.
  void stop();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Parcel> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fp4moe::engine
