// Speculative decoding with the MTP layer on the CPU (model/speculative.hpp), on make-synthetic
// glm5-tiny (3 layers + 1 MTP layer, vocab 1024, index_topk 32, F32 KV):
// - greedy output with speculation equals the plain run token for token (N = 1, 3, 4; prompts
//   shorter and longer than index_topk; max_new_tokens cutting rounds);
// - drafts forced from the plain run (the test hook `draft_override`: a random-weight MTP layer
//   rarely proposes the target's token) are all accepted, and with every third one wrong the
//   output is still the plain run's;
// - after a run with accepts and rejects, every target layer's KV rows (latent, rope key,
//   indexer key) of the sequence equal the plain run's bit for bit, and the MTP layer's equal
//   those of runs with other accept patterns;
// - rejection sampling keeps the target's distribution (chi-square, stated false-alarm rate);
//   a fixed seed reproduces the sampled tokens;
// - MTP pairs that wait for a later step (settle_queued) leave the MTP KV rows of running them at once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "../cli/cli_run_helpers.hpp"
#include "model/speculative.hpp"
#include "sequence_forward.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_cli;
using fp4moe::testing_model::EngineGenerate;
using fp4moe::testing_model::EngineGenerateOptions;

namespace {

const std::string& tiny_dir() { return synthetic_model("speculative_models", "glm5-tiny"); }

model::Model& tiny() {
  static std::unique_ptr<model::Model> m = [] {
    model::ModelOptions o;
    o.threads = 1;
    return model::Model::load(tiny_dir(), o);
  }();
  return *m;
}

// `fp4moe generate`'s path: the engine over the CPU backend (speculative: its MTP rounds).
EngineGenerate generate(const std::vector<int32_t>& prompt, const EngineGenerateOptions& o) {
  return testing_model::generate_on_engine(tiny_dir(), prompt, o);
}

std::vector<int32_t> prompt_of(int64_t n, int32_t salt = 0) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((7 + 37 * i + 101 * salt) % 1024));
  return p;
}

EngineGenerateOptions greedy_options(int64_t new_tokens, int32_t steps) {
  EngineGenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.kv_elem = KvElem::F32;
  o.page_size = 16;
  o.threads = 1;
  o.speculative_steps = steps;
  return o;
}

// The upper 1 − alpha quantile of chi-square with k degrees of freedom (Wilson–Hilferty: within
// ~1 % of the exact value for k >= 3 at these tails).
double chi2_quantile(int k, double z) {
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}
constexpr double kZ1e6 = 4.753;  // standard normal upper quantile at 1e-6

}  // namespace

TEST(Speculative, GreedyEqualsThePlainRunTokenForToken) {
  for (int64_t P : {5, 33, 40})
    for (int32_t N : {1, 3, 4}) {
      const auto prompt = prompt_of(P, int32_t(P));
      const auto plain = generate(prompt, greedy_options(23, 0));
      const auto spec = generate(prompt, greedy_options(23, N));
      EXPECT_EQ(spec.result.tokens, plain.result.tokens) << "P " << P << " N " << N;
      int64_t emitted = 0, rounds = 0;
      for (size_t i = 0; i < spec.accept_length.size(); ++i) {
        emitted += int64_t(i + 1) * spec.accept_length[i];
        rounds += spec.accept_length[i];
      }
      EXPECT_EQ(emitted, 22);  // the first token comes from the prefill
      EXPECT_EQ(rounds, spec.result.usage.spec_verify_steps);
      EXPECT_LE(spec.accepted, spec.drafted);
    }
}

TEST(Speculative, ForcedDraftsFromThePlainRunAreAcceptedAndWrongOnesRejected) {
  const auto prompt = prompt_of(12);
  const int64_t n_new = 23;
  const auto plain = generate(prompt, greedy_options(n_new, 0)).result;
  const int64_t P = int64_t(prompt.size());
  auto right = [&](uint64_t, uint64_t idx, int32_t mtp) {
    return int64_t(idx) < n_new ? plain.tokens[size_t(P + int64_t(idx))] : mtp;
  };
  auto opt = greedy_options(n_new, 3);
  opt.draft_override = right;
  const auto all = generate(prompt, opt);
  EXPECT_EQ(all.result.tokens, plain.tokens);
  EXPECT_EQ(all.accepted, all.drafted);
  // 22 tokens after the prefill's: 5 rounds of 4, then one of 2 (max_new_tokens cuts it).
  EXPECT_EQ(all.result.usage.spec_verify_steps, 6);
  EXPECT_EQ(all.accept_length[3], 5);
  EXPECT_EQ(all.accept_length[1], 1);

  opt.draft_override = [&](uint64_t id, uint64_t idx, int32_t mtp) {
    const int32_t t = right(id, idx, mtp);
    return idx % 3 == 2 ? (t + 1) % 1024 : t;
  };
  const auto mixed = generate(prompt, opt);
  EXPECT_EQ(mixed.result.tokens, plain.tokens);
  EXPECT_LT(mixed.accepted, mixed.drafted);
  EXPECT_GT(mixed.accepted, 0);
}

TEST(Speculative, KvRowsOfTheSequenceEqualThePlainRunBitwise) {
  model::Model& m = tiny();
  for (int64_t P : {12, 40}) {
    const auto prompt = prompt_of(P, 3);
    const int64_t n_new = 21;
    const auto plain = generate(prompt, greedy_options(n_new, 0));
    auto opt = greedy_options(n_new, 3);
    opt.draft_override = [&](uint64_t, uint64_t idx, int32_t mtp) {  // accepts and rejects
      const int32_t t = int64_t(idx) < n_new ? plain.result.tokens[size_t(P + int64_t(idx))] : mtp;
      return idx % 4 == 3 ? (t + 5) % 1024 : t;
    };
    const auto spec = generate(prompt, opt);
    ASSERT_EQ(spec.result.tokens, plain.result.tokens);
    ASSERT_GT(spec.accepted, 0);
    ASSERT_LT(spec.accepted, spec.drafted);
    const int64_t written = P + n_new - 1;  // the last token's KV is never computed
    // One request in a fresh pool: its page table is 0, 1, 2, ... (the pool hands out page 0 first).
    auto row = [&](const void* base, int64_t dim, int64_t elem, int64_t p) {
      return static_cast<const uint8_t*>(base) + p * dim * elem;
    };
    int64_t compared = 0;
    for (int64_t l = 0; l < m.config().num_layers; ++l) {
      const KvLayerView& a = plain.backend->kv_pool().layer(l);
      const KvLayerView& b = spec.backend->kv_pool().layer(l);
      for (int64_t p = 0; p < written; ++p) {
        ASSERT_EQ(std::memcmp(row(a.ckv, a.ckv_dim, 4, p), row(b.ckv, b.ckv_dim, 4, p),
                              size_t(a.ckv_dim) * 4), 0) << "layer " << l << " position " << p << " latent";
        ASSERT_EQ(std::memcmp(row(a.kpe, a.kpe_dim, 4, p), row(b.kpe, b.kpe_dim, 4, p),
                              size_t(a.kpe_dim) * 4), 0) << "layer " << l << " position " << p << " rope key";
        if (a.index_k) {
          ASSERT_EQ(std::memcmp(row(a.index_k, a.index_dim, 4, p),
                                row(b.index_k, b.index_dim, 4, p), size_t(a.index_dim) * 4), 0)
              << "layer " << l << " position " << p << " index key";
        }
        ++compared;
      }
    }
    EXPECT_EQ(compared, m.config().num_layers * written);
  }
}

// The MTP layer's own KV (pool layer L) after rounds with accepts and rejects: its rows of the
// sequence are rewritten from the target's hidden states, so they equal those of a run whose
// drafts were all right and of a run on the MTP layer's own drafts, bit for bit (the draft
// steps' rows at rejected positions are gone).
TEST(Speculative, TheMtpLayersKvRowsDoNotDependOnWhichDraftsWereAccepted) {
  model::Model& m = tiny();
  const auto prompt = prompt_of(20, 7);
  const int64_t P = int64_t(prompt.size()), n_new = 22;
  const auto plain = generate(prompt, greedy_options(n_new, 0)).result;
  auto run = [&](int wrong_every) {
    auto opt = greedy_options(n_new, 3);
    if (wrong_every >= 0)
      opt.draft_override = [&, wrong_every](uint64_t, uint64_t idx, int32_t mtp) {
        const int32_t t = int64_t(idx) < n_new ? plain.tokens[size_t(P + int64_t(idx))] : mtp;
        return wrong_every > 0 && idx % uint64_t(wrong_every) == 0 ? (t + 3) % 1024 : t;
      };
    return generate(prompt, opt);
  };
  const auto right = run(0), mixed = run(3), own = run(-1);
  for (const auto* r : {&right, &mixed, &own}) ASSERT_EQ(r->result.tokens, plain.tokens);
  ASSERT_LT(mixed.accepted, mixed.drafted);
  const int64_t L = m.config().num_layers;
  const KvLayerView& a = right.backend->kv_pool().layer(L);
  // One request in a fresh pool: its page table is 0, 1, 2, ... (the pool hands out page 0 first).
  auto at = [&](const EngineGenerate&, const void* base, int64_t dim, int64_t p) {
    return static_cast<const uint8_t*>(base) + p * dim * 4;
  };
  for (const auto* r : {&mixed, &own}) {
    const KvLayerView& b = r->backend->kv_pool().layer(L);
    for (int64_t p = 0; p + 1 < P + n_new; ++p) {
      ASSERT_EQ(std::memcmp(at(right, a.ckv, a.ckv_dim, p), at(*r, b.ckv, b.ckv_dim, p), size_t(a.ckv_dim) * 4), 0)
          << "MTP latent, position " << p;
      ASSERT_EQ(std::memcmp(at(right, a.kpe, a.kpe_dim, p), at(*r, b.kpe, b.kpe_dim, p), size_t(a.kpe_dim) * 4), 0)
          << "MTP rope key, position " << p;
      ASSERT_TRUE(a.index_k && b.index_k);
      ASSERT_EQ(std::memcmp(at(right, a.index_k, a.index_dim, p), at(*r, b.index_k, b.index_dim, p),
                            size_t(a.index_dim) * 4), 0)
          << "MTP index key, position " << p;
    }
  }
}

// verify_sampled over a 6-token vocabulary: drafts drawn from q, the verdict's token must be
// distributed as p. 200,000 draws, chi-square with 5 degrees of freedom at a false-alarm rate
// of 1e-6 per case (the draws are seeded, so the test is deterministic; a different seed fails
// a correct implementation with probability 1e-6).
TEST(Speculative, RejectionSamplingKeepsTheTargetDistribution) {
  const std::vector<std::pair<std::vector<double>, std::vector<double>>> cases = {
      {{0.30, 0.25, 0.20, 0.15, 0.07, 0.03}, {0.05, 0.10, 0.15, 0.20, 0.25, 0.25}},  // far apart
      {{0.30, 0.25, 0.20, 0.15, 0.07, 0.03}, {0.28, 0.27, 0.20, 0.13, 0.09, 0.03}},  // close
      {{0.50, 0.50, 0.00, 0.00, 0.00, 0.00}, {0.00, 0.20, 0.40, 0.40, 0.00, 0.00}},  // disjoint support in part
      {{0.10, 0.20, 0.30, 0.40, 0.00, 0.00}, {0.10, 0.20, 0.30, 0.40, 0.00, 0.00}},  // equal: all accepted
  };
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int n = 200000;
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& [p, q] = cases[c];
    std::vector<int64_t> count(p.size(), 0);
    int64_t accepted = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t d = model::draw_from(q, u(rng));
      const model::SampledVerdict v = model::verify_sampled(p, q, d, u(rng), u(rng));
      ++count[size_t(v.token)];
      accepted += v.accepted;
    }
    double chi2 = 0.0;
    int cells = 0;
    for (size_t t = 0; t < p.size(); ++t) {
      if (p[t] == 0.0) {
        EXPECT_EQ(count[t], 0) << "case " << c << ": token " << t << " has p = 0";
        continue;
      }
      const double e = p[t] * n;
      chi2 += (count[t] - e) * (count[t] - e) / e;
      ++cells;
    }
    EXPECT_LT(chi2, chi2_quantile(cells - 1, kZ1e6)) << "case " << c;
    // The accept rate is Σ min(p, q).
    double overlap = 0.0;
    for (size_t t = 0; t < p.size(); ++t) overlap += std::min(p[t], q[t]);
    EXPECT_NEAR(double(accepted) / n, overlap, 5.0 * std::sqrt(overlap * (1 - overlap) / n) + 1e-9) << "case " << c;
  }
}

// Through the model: the first two sampled tokens (t0 from the prefill, t1 from the first round:
// one draft, then accept / residual) at temperature 1.5 with top_k 3 — 9 cells of the joint
// distribution p(t0) · p(t1 | t0), computed exactly from the plain run's logits. 1,200 seeds;
// chi-square with 8 degrees of freedom at a false-alarm rate of 1e-6.
TEST(Speculative, SampledTokensFollowTheTargetDistributionAndASeedReproducesThem) {
  model::Model& m = tiny();
  const auto prompt = prompt_of(9, 5);
  const int64_t P = int64_t(prompt.size()), V = m.config().vocab;
  EngineGenerateOptions o = greedy_options(2, 0);
  o.sampling.temperature = 1.5f;
  o.sampling.top_k = 3;
  cpu::SamplingParams cs;  // the same knobs in cpu/'s form
  cs.temperature = 1.5f;
  cs.top_k = 3;
  // Exact joint distribution (the model over the prompt and the forced tokens).
  auto dist_after = [&](const std::vector<int32_t>& forced) {
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), forced.begin(), forced.end());
    const auto r = testing_model::forward_sequence(m, seq, P);
    const float* row = r.logits.data() + (P - 1 + int64_t(forced.size())) * V;
    const std::vector<int32_t> out(forced.begin(), forced.end());
    return cpu::sampling_distribution(row, V, cs, prompt, out);
  };
  const auto p0 = dist_after({});
  std::map<std::pair<int32_t, int32_t>, double> joint;
  for (int32_t t0 = 0; t0 < V; ++t0) {
    if (p0[size_t(t0)] == 0.0) continue;
    const auto p1 = dist_after({t0});
    for (int32_t t1 = 0; t1 < V; ++t1)
      if (p1[size_t(t1)] > 0.0) joint[{t0, t1}] = p0[size_t(t0)] * p1[size_t(t1)];
  }
  ASSERT_EQ(joint.size(), 9u);
  const int n = 1200;
  std::map<std::pair<int32_t, int32_t>, int64_t> count;
  int64_t accepted = 0;
  o.speculative_steps = 3;
  for (int s = 0; s < n; ++s) {
    o.sampling.seed = uint64_t(1000 + s);
    const auto r = generate(prompt, o);
    ++count[{r.result.tokens[size_t(P)], r.result.tokens[size_t(P + 1)]}];
    accepted += r.accepted;
  }
  double chi2 = 0.0;
  for (const auto& [cell, pr] : joint) {
    const double e = pr * n, k = double(count[cell]);
    chi2 += (k - e) * (k - e) / e;
  }
  for (const auto& [cell, k] : count) EXPECT_TRUE(joint.count(cell)) << cell.first << "," << cell.second << " outside the support";
  EXPECT_LT(chi2, chi2_quantile(8, kZ1e6));
  std::printf("sampled: chi2 %.2f (8 dof), %lld of %d drafts accepted\n", chi2, static_cast<long long>(accepted), n);

  // A fixed seed reproduces the tokens, at length.
  o.max_new_tokens = 24;
  o.sampling.seed = 77;
  const auto a = generate(prompt, o), b = generate(prompt, o);
  EXPECT_EQ(a.result.tokens, b.result.tokens);
}

// Queued MTP pairs that wait (MtpSpeculator::settle_queued, defer_rows 8) give the MTP layer's KV
// rows and next draft of running each step's pairs at once, bit for bit: a prompt in two chunks
// (5 pairs wait; the second chunk's 7 would pass 8 together, so the 5 run first), then decode
// steps of one pair each (the waiting 7 + 1 fit, the next one flushes them), then the rest.
TEST(Speculative, WaitingMtpPairsGiveTheSameMtpKvAndDraftAsRunningEachStep) {
  model::Model& m = tiny();
  const int64_t H = m.config().hidden, L = m.config().num_layers, V = m.config().vocab;
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int32_t n = 15;
  std::vector<int32_t> tok(n + 1);
  for (auto& t : tok) t = int32_t(g() % uint32_t(V));
  std::vector<float> hid(size_t(n) * size_t(H));
  for (float& v : hid) v = nd(g);
  const std::vector<int32_t> pages = {0};
  struct Run {
    std::unique_ptr<model::HostKvPool> kv;
    std::unique_ptr<model::MtpSpeculator> spec;
  };
  auto run = [&](int64_t defer) {
    Run r;
    r.kv = std::make_unique<model::HostKvPool>(m.mtp_kv_geometry(16, 2, KvElem::F32), m.mtp_kv_index_layers());
    r.spec = std::make_unique<model::MtpSpeculator>(m, *r.kv, 1);
    r.spec->defer_rows = defer;
    auto add = [&](int32_t p0, int32_t count, int32_t next) {
      r.spec->add_target_rows(1, p0, std::span<const int32_t>(tok.data() + p0, size_t(count)),
                              hid.data() + int64_t(p0) * H, next, pages);
      r.spec->settle_queued();
    };
    add(0, 6, -1);           // chunk 1: 5 pairs, the last row waits for its next token
    add(6, 6, tok[12]);      // chunk 2: 7 pairs
    for (int32_t p = 12; p < n; ++p) add(p, 1, tok[size_t(p) + 1]);  // decode steps
    r.spec->run_queued();
    return r;
  };
  const Run each = run(0), waiting = run(8);
  EXPECT_EQ(each.spec->queued_mtp_steps, 5);
  EXPECT_EQ(waiting.spec->queued_mtp_steps, 3);  // 5 | 7 + 1 | 2
  const KvLayerView& a = each.kv->layer(L);
  const KvLayerView& b = waiting.kv->layer(L);
  auto row = [](const void* base, int64_t dim, int64_t p) { return static_cast<const uint8_t*>(base) + p * dim * 4; };
  ASSERT_TRUE(a.index_k && b.index_k);
  for (int64_t p = 0; p < n; ++p) {
    ASSERT_EQ(std::memcmp(row(a.ckv, a.ckv_dim, p), row(b.ckv, b.ckv_dim, p), size_t(a.ckv_dim) * 4), 0) << p;
    ASSERT_EQ(std::memcmp(row(a.kpe, a.kpe_dim, p), row(b.kpe, b.kpe_dim, p), size_t(a.kpe_dim) * 4), 0) << p;
    ASSERT_EQ(std::memcmp(row(a.index_k, a.index_dim, p), row(b.index_k, b.index_dim, p), size_t(a.index_dim) * 4), 0)
        << p;
  }
}
