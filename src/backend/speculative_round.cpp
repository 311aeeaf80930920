#include "backend/speculative_round.hpp"

#include "core/error.hpp"
#include "grammar/grammar.hpp"

namespace fp4moe::engine {
namespace {

// A request's grammar matcher (SampleSpec::grammar) as the speculative round's constraint.
class MatcherConstraint final : public model::TokenConstraint {
 public:
  explicit MatcherConstraint(grammar::Matcher& m) : m_(m) {}
  void fill_mask(std::span<uint32_t> mask) override { m_.fill_mask(mask); }
  bool accept(int32_t token) override { return m_.accept(token); }
  bool terminated() const override { return m_.terminated(); }
  void rollback(int32_t n) override { m_.rollback(n); }

 private:
  grammar::Matcher& m_;
};

}  // namespace

SpecRoundInput spec_round_input(const StepBatch& batch, const DecodeLimits& limits, int32_t steps) {
  const int32_t n = batch.num_requests();
  SpecRoundInput in;
  in.requests.resize(size_t(n));
  for (int32_t r = 0; r < n; ++r) {
    FP4MOE_CHECK(batch.count(r) == 1 && batch.sample[size_t(r)], "speculative decode: request {} is not decoding",
                 batch.request_ids[size_t(r)]);
    const SampleSpec& sp = batch.sampling[size_t(r)];
    FP4MOE_CHECK(sp.params, "sampling without parameters");
    model::SpecRequest& q = in.requests[size_t(r)];
    q.id = batch.request_ids[size_t(r)];
    q.start = batch.start(r);
    q.last_token = batch.request_tokens(r)[0];
    q.pages = batch.page_table(r);
    q.max_new = std::min(limits.max_new[size_t(r)], steps);
    q.stop_ids = limits.stop_ids[size_t(r)];
    q.sampling = *sp.params;
    q.prompt = sp.prompt;
    q.generated.assign(sp.generated.begin(), sp.generated.end());
    q.output_index = uint64_t(sp.output_index);
    FP4MOE_CHECK(!sp.allowed_tokens, "speculative decode: request {} comes with a fixed token mask (a round masks its "
                 "rows by the request's grammar, SampleSpec::grammar)", q.id);
    if (sp.grammar) q.constraint = in.constraints.emplace_back(std::make_unique<MatcherConstraint>(*sp.grammar)).get();
  }
  return in;
}

void spec_round_output(const std::vector<model::SpecRoundResult>& res, DecodeOutput& out, StepObserver* observer) {
  out.tokens.assign(res.size(), {});
  for (size_t r = 0; r < res.size(); ++r) {
    for (const cpu::SampledToken& s : res[r].tokens) {
      GeneratedToken g;
      g.id = s.token;
      g.logprob = s.logprob;
      for (const auto& [id, lp] : s.top) g.top.push_back({id, lp});
      out.tokens[r].push_back(std::move(g));
    }
    if (observer) observer->on_speculative(res[r].drafted, res[r].accepted, int32_t(res[r].tokens.size()));
  }
}

}  // namespace fp4moe::engine
