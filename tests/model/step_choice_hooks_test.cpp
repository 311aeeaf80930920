// model::StepChoiceHooks (the GPU-vs-CPU test imposes the GPU's routing and top-k through
// them): imposing the model's own choices changes nothing, bit for bit; imposing other experts
// changes the output; every MoE layer of every step is seen once, in step order.
#include <cstring>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "sequence_forward.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

using namespace fp4moe;

namespace {

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(2 + (i * 37 + 108) % (vocab - 2)));
  return p;
}

TEST(StepChoiceHooks, ImposingTheModelsOwnRoutingChangesNothingAndOtherRoutingChangesTheLogits) {
  model::ModelOptions o;
  o.threads = 2;
  auto m = model::Model::load(testing_model::golden_dir("glm5-tiny-sparse") + "/model", o);
  const int64_t P = 20, N = 4, E = m->config().moe.num_experts;
  const auto seq = prompt_of(P + N - 1, m->config().vocab);  // a P-token prompt, then N - 1 decode steps
  std::map<int64_t, std::vector<std::vector<float>>> seen;  // layer -> per step logits
  m->options().hooks.on_routing = [&](int64_t l, int64_t T, const float* lg, const int32_t*) {
    seen[l].emplace_back(lg, lg + T * E);
  };
  const auto a = testing_model::forward_sequence(*m, seq, P);
  ASSERT_FALSE(seen.empty());
  for (const auto& [l, steps] : seen) {
    EXPECT_TRUE(m->config().moe_layer[size_t(l)]) << "layer " << l;
    ASSERT_EQ(int64_t(steps.size()), N) << "layer " << l << ": one call per step";
    EXPECT_EQ(int64_t(steps[0].size()), P * E);
  }

  std::map<int64_t, size_t> cur;
  m->options().hooks = {};
  m->options().hooks.router_logits = [&](int64_t l, int64_t T) -> const float* {
    const auto& v = seen.at(l).at(cur[l]++);
    EXPECT_EQ(int64_t(v.size()), T * E);
    return v.data();
  };
  const auto b = testing_model::forward_sequence(*m, seq, P);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0) << "own routing imposed";

  // Other experts: every token's logits reversed (the least likely experts chosen).
  std::vector<float> flipped;
  cur.clear();
  m->options().hooks.router_logits = [&](int64_t l, int64_t) -> const float* {
    flipped = seen.at(l).at(cur[l]++);
    for (float& x : flipped) x = -x;
    return flipped.data();
  };
  const auto c = testing_model::forward_sequence(*m, seq, P);
  EXPECT_GT(testing_model::rel_l2(c.logits.data(), a.logits.data(), a.logits.size()), 1e-2) << "other routing imposed";
  m->options().hooks = {};
}

}  // namespace
