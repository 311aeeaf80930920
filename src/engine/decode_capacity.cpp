#include "engine/decode_capacity.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace fp4moe::engine {

std::optional<DecodeRefusal> decode_capacity_refusal(const StepBatch& batch, const DecodeLimits& limits, int32_t steps,
                                                     const DecodeCapacity& cap) {
  const int32_t n = batch.num_requests();
  if (int32_t(limits.max_new.size()) != n || int32_t(limits.stop_ids.size()) != n)
    return DecodeRefusal{fmt::format("decode limits for {} / {} requests, the round has {}", limits.max_new.size(),
                                     limits.stop_ids.size(), n),
                         {}};
  if (steps < 1 || steps > cap.max_steps)
    return DecodeRefusal{fmt::format("{} decode steps per round; the device path was sized for 1 .. {} "
                                     "(--num-continuous-decode-steps)",
                                     steps, cap.max_steps),
                         {}};
  DecodeRefusal over;
  int32_t worst = 0;
  for (int32_t r = 0; r < n; ++r) {
    if (batch.count(r) != 1 || !batch.sample[size_t(r)])
      return DecodeRefusal{fmt::format("multi-step decode takes one sampling token per request (request {} has {})", r,
                                       batch.count(r)),
                           {}};
    const int32_t stops = int32_t(limits.stop_ids[size_t(r)].size());
    if (stops > cap.max_stop_ids) {
      over.request_ids.push_back(batch.request_ids[size_t(r)]);
      worst = std::max(worst, stops);
    }
  }
  if (over.request_ids.empty()) return std::nullopt;
  over.reason = fmt::format("{} stop ids (its stop_token_ids plus the EOS ids); the device path takes at most {}", worst,
                            cap.max_stop_ids);
  return over;
}

}  // namespace fp4moe::engine
