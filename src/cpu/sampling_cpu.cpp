#include "cpu/sampling_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "core/error.hpp"
#include "core/sampling_scheme.hpp"

namespace fp4moe::cpu {

void validate_sampling(const SamplingParams& p) {
  FP4MOE_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature {} must be >= 0 (0: greedy)",
               p.temperature);
  FP4MOE_CHECK(p.top_k == kTopKOff || p.top_k >= 1, "top_k must be -1 (off) or at least 1, got {}", p.top_k);
  FP4MOE_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p {} must be in (0, 1]", p.top_p);
  FP4MOE_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p {} must be in [0, 1]", p.min_p);
  FP4MOE_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
               "repetition_penalty {} must be > 0", p.repetition_penalty);
  FP4MOE_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty),
               "presence / frequency penalties must be finite");
  FP4MOE_CHECK(p.logprobs_top_n >= -1 && p.logprobs_top_n <= kMaxTopLogprobs, "logprobs top_n {} must be in [0, {}]",
               p.logprobs_top_n, kMaxTopLogprobs);
}

bool stable_draw(const SampledToken& t, double d) {
  const double eps_g = d + 4.1e-6 + 1.2e-7 * (t.draw_x_abs + 17.0);
  return t.draw_margin > 2.0 * eps_g && t.cut_margin > 4.0 * d + 2.4e-7 && (d == 0.0 || t.rank_margin > 2.0 * d);
}

namespace {

// Steps 1 and 3 of the scheme: penalties (the device's float operations: once per distinct
// token), then / temperature unless greedy. Built with -ffp-contract=off (src/cpu/CMakeLists).
std::vector<float> scaled_logits(const float* logits, int64_t vocab, const SamplingParams& p,
                                 const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  validate_sampling(p);
  FP4MOE_CHECK(vocab >= 1 && vocab < (int64_t(1) << 23), "sampling over a vocabulary of {} (1 .. 2^23)", vocab);
  const size_t V = size_t(vocab);
  std::vector<float> x(logits, logits + V);
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(V, 0);
    for (const auto* list : {&prompt, &output})
      for (int32_t t : *list)
        if (t >= 0 && t < vocab && !seen[size_t(t)]) {
          seen[size_t(t)] = 1;
          float& v = x[size_t(t)];
          v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
        }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::vector<int32_t> count(V, 0);
    for (int32_t t : output)
      if (t >= 0 && t < vocab) ++count[size_t(t)];
    for (size_t t = 0; t < V; ++t)
      if (count[t]) {
        const float f = p.frequency_penalty * float(count[t]);
        x[t] = x[t] - (p.presence_penalty + f);
      }
  }
  if (!p.greedy())
    for (float& v : x) v = v / p.temperature;
  return x;
}

// Rank order: x descending by the order key (NaN last), ties: the lower id.
struct RankLess {
  const std::vector<uint32_t>& key;
  bool operator()(int32_t a, int32_t b) const {
    return key[size_t(a)] > key[size_t(b)] || (key[size_t(a)] == key[size_t(b)] && a < b);
  }
};

std::vector<uint32_t> order_keys(const std::vector<float>& x) {
  std::vector<uint32_t> k(x.size());
  for (size_t i = 0; i < x.size(); ++i) k[i] = float_order_key(x[i]);
  return k;
}

int32_t first_in_rank(const std::vector<uint32_t>& key) {
  int32_t best = 0;
  for (size_t i = 1; i < key.size(); ++i)
    if (key[i] > key[size_t(best)]) best = int32_t(i);
  return best;
}

// The kept set of step 4: `all` (no truncation: every token, in id order) or the first n of
// `order` (the rank order, at least as long as n).
struct Kept {
  bool all = true;
  std::vector<int32_t> order;
  size_t n = 0;
  double cut_margin = std::numeric_limits<double>::infinity();
  double rank_margin = std::numeric_limits<double>::infinity();
};

// The first n tokens of the rank order (RankLess), n < V: one pass keeping the best n seen in a
// min-heap of packed keys — the order key above the complement of the id, so that a larger
// packed key is exactly RankLess's "before" (a higher key, or the same key and a lower id). The
// set is the same as a sort's; a token beaten by the heap's least costs one comparison. Returns
// the packed key of the best token left out (top-k's first dropped one).
uint64_t first_in_rank_order(const std::vector<uint32_t>& key, size_t n, std::vector<int32_t>& order) {
  const size_t V = key.size();
  auto packed = [&](size_t i) { return (uint64_t(key[i]) << 32) | uint64_t(~uint32_t(i)); };
  std::vector<uint64_t> best(n);
  for (size_t i = 0; i < n; ++i) best[i] = packed(i);
  std::make_heap(best.begin(), best.end(), std::greater<uint64_t>());
  // Every token not kept was passed over or pushed out of the heap: the best of them is the
  // largest packed key among both. Blocks whose best cannot enter the heap are passed over whole.
  constexpr size_t kBlock = 16;
  uint64_t dropped = 0;
  for (size_t i = n; i < V; i += kBlock) {
    const size_t e = std::min(V, i + kBlock);
    uint64_t block = 0;
    for (size_t j = i; j < e; ++j) block = std::max(block, packed(j));
    if (block <= best.front()) {
      dropped = std::max(dropped, block);
      continue;
    }
    for (size_t j = i; j < e; ++j) {
      const uint64_t pk = packed(j);
      if (pk <= best.front()) {
        dropped = std::max(dropped, pk);
        continue;
      }
      std::pop_heap(best.begin(), best.end(), std::greater<uint64_t>());
      dropped = std::max(dropped, best.back());
      best.back() = pk;
      std::push_heap(best.begin(), best.end(), std::greater<uint64_t>());
    }
  }
  std::sort(best.begin(), best.end(), std::greater<uint64_t>());
  order.resize(n);
  for (size_t r = 0; r < n; ++r) order[r] = int32_t(~uint32_t(best[r]));
  return dropped;
}

// The first n tokens of the rank order when n is large (n <= V; V: the full sort): nth_element,
// then a sort of the prefix (the heap above pays log n per token that enters it).
void first_in_rank_order_large(const std::vector<uint32_t>& key, size_t n, std::vector<int32_t>& order) {
  order.resize(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + ptrdiff_t(n), order.end(), RankLess{key});
  order.resize(n);
  std::sort(order.begin(), order.end(), RankLess{key});
}

// Prefixes up to this many tokens by the heap, longer ones by nth_element (truncate).
constexpr size_t kHeapPrefix = 4096;

Kept truncate(const std::vector<float>& x, const std::vector<uint32_t>& key, float m, const SamplingParams& p) {
  const int64_t vocab = int64_t(x.size());
  const size_t V = x.size();
  Kept k;
  k.n = V;
  const bool top_k = p.top_k_on(vocab), top_p = p.top_p < 1.0f, min_p = p.min_p > 0.0f;
  if (!top_k && !top_p && !min_p) return k;
  k.all = false;
  std::vector<int32_t>& order = k.order;
  const size_t n_k = top_k ? size_t(p.top_k) : V;
  float first_out = -std::numeric_limits<float>::infinity();  // the best token top-k drops
  uint64_t z_all = 0;                                          // without top-k: the whole vocabulary's mass
  if (n_k < V) {
    // Top-k's first dropped token has the max x of the dropped ones (NaN keys lie below every
    // number: a NaN there means all are NaN, whose max over non-NaN is -inf).
    const float fx = x[size_t(~uint32_t(first_in_rank_order(key, n_k, order)))];
    if (!std::isnan(fx)) first_out = fx;
  } else {
    // Without top-k, top-p and min-p read the rank order only as far as their cut: how far, from
    // one pass over the vocabulary — min-p's count above its cut, or top-p's mass per bin of the
    // order key's top 16 bits (a token of a higher bin ranks before every token of a lower one),
    // summed from the top bin down to the one where it reaches the target. Then that prefix
    // alone is ordered (a heap, or nth_element and a sort): the cut is a full sort's.
    size_t need = V;
    if (top_p) {
      std::vector<uint64_t> bin_mass(size_t(1) << 16, 0);
      std::vector<uint32_t> bin_count(size_t(1) << 16, 0);
      for (size_t i = 0; i < V; ++i) {
        const uint64_t w = mass_weight(x[i], m);
        z_all += w;
        bin_mass[key[i] >> 16] += w;
        ++bin_count[key[i] >> 16];
      }
      const uint64_t target = std::min<uint64_t>(z_all, uint64_t(std::ceil(double(p.top_p) * double(z_all))));
      uint64_t mass = 0;
      size_t count = 0;
      for (size_t b = bin_mass.size(); b-- > 0;) {
        mass += bin_mass[b], count += bin_count[b];
        if (mass >= target && count > 0) break;
      }
      need = count;
    } else {  // min-p alone: the tokens at or above its cut, and the first one below it
      const float cut = m + logf(p.min_p);
      need = 1;
      for (float v : x) need += v >= cut;
    }
    if (need < V && need <= kHeapPrefix)
      first_in_rank_order(key, need, order);
    else
      first_in_rank_order_large(key, std::min(need, V), order);
  }
  if (n_k < V) k.rank_margin = double(x[size_t(order[n_k - 1])]) - double(first_out);  // last kept vs first dropped
  size_t n = n_k;
  if (top_p) {
    uint64_t z_k = z_all;  // the kept set's mass: top-k's, or every token's (integers: any order)
    if (n_k < V)
      for (size_t r = 0; r < n_k; ++r) z_k += mass_weight(x[size_t(order[r])], m);
    const uint64_t target = std::min<uint64_t>(z_k, uint64_t(std::ceil(double(p.top_p) * double(z_k))));
    uint64_t s = 0;
    for (size_t r = 0; r < order.size(); ++r) {
      const uint64_t before = s;
      s += mass_weight(x[size_t(order[r])], m);
      if (s >= target) {
        n = r + 1;
        k.cut_margin = z_k ? double(std::min(s - target, target - before)) / double(z_k) : 0.0;
        break;
      }
    }
  }
  if (min_p) {
    const float cut = m + logf(p.min_p);
    size_t kept = 0;
    while (kept < n && x[size_t(order[kept])] >= cut) ++kept;
    kept = std::max<size_t>(kept, 1);  // the first always stays (x_max >= cut unless non-finite)
    // The decision that could flip: the last kept token, and the first one min-p drops inside
    // the prefix the other cuts kept (beyond it min-p decides nothing).
    double margin = std::abs(double(x[size_t(order[kept - 1])]) - double(cut));
    if (kept < n) margin = std::min(margin, std::abs(double(x[size_t(order[kept])]) - double(cut)));
    k.cut_margin = std::min(k.cut_margin, margin / std::max(1.0, std::abs(double(cut))));
    n = std::min(n, kept);
  }
  k.n = n;
  return k;
}

// Step 5 over the kept tokens: the winner and the margin to the runner-up.
void gumbel_draw(const std::vector<float>& x, const Kept& k, const SamplingParams& p, uint64_t step, SampledToken& out) {
  uint32_t best_key = 0, second_key = 0;
  double best = 0.0, second = -std::numeric_limits<double>::infinity();
  int32_t best_id = -1, second_id = -1;
  auto visit = [&](int32_t i, uint32_t bits) {
    const float g = gumbel_key(x[size_t(i)], bits);
    const uint32_t key = float_order_key(g);
    if (best_id < 0 || key > best_key || (key == best_key && i < best_id)) {
      if (best_id >= 0) second_key = best_key, second = best, second_id = best_id;
      best_key = key, best = g, best_id = i;
    } else if (second_id < 0 || key > second_key) {
      second_key = key, second = g, second_id = i;
    }
  };
  // A token whose x + kGumbelBound is below the runner-up's key can change neither the
  // winner nor the margin: skipped (exactly), as the device skips below its winner.
  auto skip = [&](int32_t i) { return second_id >= 0 && double(x[size_t(i)]) + kGumbelBound < second; };
  if (k.all) {
    const uint32_t V = uint32_t(x.size());
    for (uint32_t i4 = 0; i4 < V; i4 += 4) {
      bool any = false;
      for (uint32_t j = i4; j < std::min(V, i4 + 4); ++j) any |= !skip(int32_t(j));
      if (!any) continue;
      const Philox4 r = philox4x32_10(i4 >> 2, uint32_t(step), uint32_t(step >> 32), 0x53414D50u, uint32_t(p.seed),
                                      uint32_t(p.seed >> 32));
      for (uint32_t j = i4; j < std::min(V, i4 + 4); ++j)
        if (!skip(int32_t(j))) visit(int32_t(j), r.v[j & 3]);
    }
  } else {
    for (size_t r = 0; r < k.n; ++r) {
      const int32_t i = k.order[r];
      if (!skip(i)) visit(i, sample_bits(p.seed, step, uint32_t(i)));
    }
  }
  out.token = best_id;
  out.kept = int64_t(k.all ? x.size() : k.n);
  out.cut_margin = k.cut_margin;
  out.rank_margin = k.rank_margin;
  if (out.kept > 1) {
    out.draw_margin = best - second;
    out.draw_x_abs = std::max(std::abs(double(x[size_t(best_id)])), std::abs(double(x[size_t(second_id)])));
  }
}

void fill_logprobs(SampledToken& out, const std::vector<float>& x, const std::vector<uint32_t>& key, float m,
                   const SamplingParams& p) {
  if (p.logprobs_top_n < 0) return;
  uint64_t z = 0;
  for (float v : x) z += mass_weight(v, m);
  const double lse = double(m) + std::log(double(z) / kMassOne);
  auto lp = [&](int32_t t) { return float(double(x[size_t(t)]) - lse); };
  out.logprob = lp(out.token);
  const size_t top = std::min<size_t>(size_t(p.logprobs_top_n), x.size());
  if (top == 0) return;
  std::vector<int32_t> all(x.size());
  std::iota(all.begin(), all.end(), 0);
  std::partial_sort(all.begin(), all.begin() + ptrdiff_t(top), all.end(), RankLess{key});
  for (size_t r = 0; r < top; ++r) out.top.emplace_back(all[r], lp(all[r]));
}

}  // namespace

SampledToken sample_cpu(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, uint64_t step) {
  const std::vector<float> x = scaled_logits(logits, vocab, p, prompt, output);
  const std::vector<uint32_t> key = order_keys(x);
  const int32_t first = first_in_rank(key);
  const float m = x[size_t(first)];
  SampledToken out;
  if (p.greedy()) {
    out.token = first;
    out.kept = 1;
    // The decision: the highest x against the runner-up (a comparison of x alone).
    int32_t second = -1;
    for (size_t i = 0; i < x.size(); ++i)
      if (int32_t(i) != first && (second < 0 || key[i] > key[size_t(second)])) second = int32_t(i);
    if (second >= 0) out.rank_margin = double(m) - double(x[size_t(second)]);
  } else {
    gumbel_draw(x, truncate(x, key, m, p), p, step, out);
  }
  fill_logprobs(out, x, key, m, p);
  return out;
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& p,
                                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  // The sparse form's values at their ids, 0 elsewhere (the kept set's probabilities are the same
  // doubles either way: sampling_distribution_sparse keeps the dense order of summation).
  const SparseDistribution s = sampling_distribution_sparse(logits, vocab, p, prompt, output);
  std::vector<double> d(static_cast<size_t>(vocab), 0.0);
  for (size_t j = 0; j < s.ids.size(); ++j) d[size_t(s.ids[j])] = s.prob[j];
  return d;
}

double SparseDistribution::at(int32_t token) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), token);
  return it != ids.end() && *it == token ? prob[size_t(it - ids.begin())] : 0.0;
}

SparseDistribution sampling_distribution_sparse(const float* logits, int64_t vocab, const SamplingParams& p,
                                                const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  FP4MOE_CHECK(!p.greedy(), "sampling_distribution: greedy sampling has no distribution to draw from");
  std::vector<float> x = scaled_logits(logits, vocab, p, prompt, output);
  SparseDistribution d;
  d.vocab = vocab;
  // The draw's rules for non-finite logits: a NaN never wins (no mass: counted as -inf), a +inf
  // always does (the +inf logits share all the mass); exp() would make the whole row NaN.
  int64_t top = 0;
  for (float& v : x) {
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
    top += v == std::numeric_limits<float>::infinity();
  }
  if (top > 0) {
    for (int64_t i = 0; i < vocab; ++i)
      if (x[size_t(i)] == std::numeric_limits<float>::infinity()) {
        d.ids.push_back(int32_t(i));
        d.prob.push_back(1.0 / double(top));
      }
    return d;
  }
  const std::vector<uint32_t> key = order_keys(x);
  const float m = x[size_t(first_in_rank(key))];
  const Kept k = truncate(x, key, m, p);
  double mass = 0.0;  // summed in the id order, or the rank order of the kept set
  if (k.all) {
    d.ids.resize(size_t(vocab));
    d.prob.resize(size_t(vocab));
    for (int32_t i = 0; i < int32_t(vocab); ++i) {
      d.ids[size_t(i)] = i;
      mass += d.prob[size_t(i)] = std::exp(double(x[size_t(i)]) - double(m));
    }
  } else {
    std::vector<std::pair<int32_t, double>> kept(k.n);
    for (size_t r = 0; r < k.n; ++r) {
      const int32_t i = k.order[r];
      mass += (kept[r] = {i, std::exp(double(x[size_t(i)]) - double(m))}).second;
    }
    std::sort(kept.begin(), kept.end());
    if (std::isnan(mass)) {  // every logit -inf: the dense form is NaN everywhere (0 / NaN); so is this
      d.ids.resize(size_t(vocab));
      d.prob.assign(size_t(vocab), 0.0);
      for (int32_t i = 0; i < int32_t(vocab); ++i) d.ids[size_t(i)] = i;
      for (const auto& [i, e] : kept) d.prob[size_t(i)] = e;
    } else {
      for (const auto& [i, e] : kept) d.ids.push_back(i), d.prob.push_back(e);
    }
  }
  for (double& v : d.prob) v /= mass;
  return d;
}

SampledToken logprobs_of(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output, int32_t token) {
  FP4MOE_CHECK(token >= 0 && token < vocab, "logprobs_of: token {} outside the vocabulary", token);
  SampledToken out;
  out.token = token;
  if (p.logprobs_top_n < 0) return out;
  const std::vector<float> x = scaled_logits(logits, vocab, p, prompt, output);
  const std::vector<uint32_t> key = order_keys(x);
  fill_logprobs(out, x, key, x[size_t(first_in_rank(key))], p);
  return out;
}

double sampling_uniform(uint64_t seed, uint64_t step) { return uniform_53(seed, step); }

int64_t apply_token_bitmask(float* logits, int64_t vocab, const uint32_t* allowed) {
  int64_t kept = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if ((allowed[v >> 5] >> (v & 31)) & 1u)
      ++kept;
    else
      logits[v] = -std::numeric_limits<float>::infinity();
  }
  return kept;
}

}  // namespace fp4moe::cpu
