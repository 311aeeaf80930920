// One draft/verify round's requests and results as the cpu and cuda backends exchange them with
// model::MtpSpeculator (model/speculative.hpp): the engine's decode batch (one token per
// request) turned into SpecRequests — a constrained request (SampleSpec::grammar) gets its
// matcher as the round's TokenConstraint — and the round's emitted tokens turned back into the
// engine's DecodeOutput, with the observer's drafted / accepted counts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.hpp"
#include "model/speculative.hpp"

namespace fp4moe::engine {

struct SpecRoundInput {
  std::vector<model::SpecRequest> requests;                    // one per batch request, in order
  std::vector<std::unique_ptr<model::TokenConstraint>> constraints;  // owned by the round (requests point in)
};

// Throws fp4moe::Error (one line) for a request that is not decoding one token, sampling without
// parameters, or one that comes with a fixed token mask (SampleSpec::allowed_tokens: a round
// masks its rows by the request's grammar itself).
SpecRoundInput spec_round_input(const StepBatch& batch, const DecodeLimits& limits, int32_t steps);

// The round's tokens into out (request r's in out.tokens[r]); observer (may be null) gets each
// request's drafted / accepted / emitted counts.
void spec_round_output(const std::vector<model::SpecRoundResult>& res, DecodeOutput& out, StepObserver* observer);

}  // namespace fp4moe::engine
