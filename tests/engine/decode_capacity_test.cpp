// engine/decode_capacity: the one rule that says whether a K-step decode round fits what a
// device backend was sized for (the GPU runner refuses the rest with a StepError instead of a
// silent host loop), and the capacity `serve` gives it: every round serve can schedule fits.
#include <gtest/gtest.h>

#include <vector>

#include "engine/decode_capacity.hpp"

namespace fp4moe::engine {
namespace {

// A decode round of n requests, one token each (ids 100, 101, ...), each with `stops[r]` stop ids.
struct Round {
  StepBatch batch;
  DecodeLimits limits;
  Round(const std::vector<int>& stops, int tokens_of_first = 1) {
    batch.page_size = 16;
    for (size_t r = 0; r < stops.size(); ++r) {
      const std::vector<int32_t> toks(size_t(r == 0 ? tokens_of_first : 1), 7), pages{int32_t(r)};
      batch.add(100 + r, toks, 3, pages, true, SampleSpec{});
      limits.max_new.push_back(4);
      limits.stop_ids.push_back(std::vector<int32_t>(size_t(stops[r]), 2));
    }
  }
};

TEST(DecodeCapacity, ARoundWithinTheSizesFits) {
  const Round round({1, 3, 16});
  EXPECT_FALSE(decode_capacity_refusal(round.batch, round.limits, 1, {16, 16}).has_value());
  EXPECT_FALSE(decode_capacity_refusal(round.batch, round.limits, 16, {16, 16}).has_value());
}

TEST(DecodeCapacity, MoreStepsThanSizedIsRefusedForTheWholeRoundNamingTheFlag) {
  const Round round({1, 1});
  const auto no = decode_capacity_refusal(round.batch, round.limits, 17, {16, 16});
  ASSERT_TRUE(no.has_value());
  EXPECT_TRUE(no->request_ids.empty());
  EXPECT_NE(no->reason.find("17 decode steps"), std::string::npos) << no->reason;
  EXPECT_NE(no->reason.find("--num-continuous-decode-steps"), std::string::npos) << no->reason;
  EXPECT_EQ(no->reason.find('\n'), std::string::npos);
  EXPECT_TRUE(decode_capacity_refusal(round.batch, round.limits, 0, {16, 16}).has_value());
}

TEST(DecodeCapacity, TooManyStopIdsRefusesExactlyThoseRequests) {
  const Round round({2, 17, 16, 20});
  const auto no = decode_capacity_refusal(round.batch, round.limits, 4, {16, 16});
  ASSERT_TRUE(no.has_value());
  EXPECT_EQ(no->request_ids, (std::vector<uint64_t>{101, 103}));
  EXPECT_NE(no->reason.find("20 stop ids"), std::string::npos) << no->reason;
  EXPECT_NE(no->reason.find("at most 16"), std::string::npos) << no->reason;
}

TEST(DecodeCapacity, ARoundOfTheWrongShapeIsRefused) {
  Round round({1, 1});
  round.limits.stop_ids.pop_back();  // limits for one request of two
  EXPECT_TRUE(decode_capacity_refusal(round.batch, round.limits, 2, {16, 16}).has_value());
  const Round two_tokens({1, 1}, /*tokens_of_first=*/2);
  const auto no = decode_capacity_refusal(two_tokens.batch, two_tokens.limits, 2, {16, 16});
  ASSERT_TRUE(no.has_value());
  EXPECT_NE(no->reason.find("one sampling token per request"), std::string::npos) << no->reason;
}

// serve sizes a device backend from --num-continuous-decode-steps and the API's stop-id limit
// (api_request.cpp refuses more than kMaxStopTokenIds with a 400): the largest request it
// accepts, with every EOS id added, fits at every K the flag allows.
TEST(DecodeCapacity, EveryRoundServeCanScheduleFitsTheCapacityItGives) {
  for (int k : {1, 2, 16, 17, 64, 1024})
    for (size_t eos : {size_t(0), size_t(1), size_t(3)}) {
      const DecodeCapacity cap = serve_decode_capacity(k, eos);
      const Round round({int(kMaxStopTokenIds + eos), 0, int(eos)});
      EXPECT_FALSE(decode_capacity_refusal(round.batch, round.limits, k, cap).has_value()) << "K " << k << ", eos " << eos;
      const Round over({int(kMaxStopTokenIds + eos + 1)});
      EXPECT_TRUE(decode_capacity_refusal(over.batch, over.limits, k, cap).has_value());
      EXPECT_TRUE(decode_capacity_refusal(round.batch, round.limits, k + 1, cap).has_value());
    }
}

}  // namespace
}  // namespace fp4moe::engine
