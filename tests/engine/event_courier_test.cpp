#include <gtest/gtest.h>

#include "engine/event_courier.hpp"

using namespace fp4moe::engine;

namespace {

std::vector<OutputChannel::Item> drain(OutputChannel& ch) {
  std::vector<OutputChannel::Item> all;
  while (ch.wait(all, std::chrono::milliseconds(0))) {
  }
  return all;
}

}  // namespace

TEST(EventCourier, DeliversEveryEventInOrderBeforeStopReturns) {
  auto a = std::make_shared<OutputChannel>(), b = std::make_shared<OutputChannel>();
  EventCourier courier;
  const int batches = 200, per = 7;
  for (int i = 0; i < batches; ++i) {
    std::vector<EventCourier::Parcel> parcels;
    for (int j = 0; j < per; ++j) {
      OutputEvent ev;
      ev.tokens.emplace_back();
      ev.tokens.back().id = int32_t(i * per + j);
      ev.finished = (i == batches - 1 && j == per - 1);
      parcels.push_back({j % 2 ? b : a, j % 2, std::move(ev)});
    }
    courier.send(parcels);
    EXPECT_TRUE(parcels.empty());
  }
  courier.stop();
  courier.stop();  // idempotent
  const auto got_a = drain(*a), got_b = drain(*b);
  ASSERT_EQ(got_a.size() + got_b.size(), size_t(batches * per));
  for (const auto* got : {&got_a, &got_b}) {
    for (size_t k = 1; k < got->size(); ++k)
      EXPECT_LT((*got)[k - 1].event.tokens[0].id, (*got)[k].event.tokens[0].id) << "out of order at " << k;
  }
  EXPECT_EQ(got_a.front().index, 0);
  EXPECT_EQ(got_b.front().index, 1);
  EXPECT_TRUE(got_a.back().event.finished);  // the last parcel (j = 6) went to a
}
