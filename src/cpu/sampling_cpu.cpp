#include "cpu/sampling_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/error.hpp"

namespace fp4moe::cpu {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double uniform(uint64_t seed, uint64_t step) {
  const uint64_t r = splitmix64(splitmix64(seed) ^ (step * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  return double(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

// Higher value first; ties: the lower id.
auto rank_by(const std::vector<float>& v) {
  return [&v](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); };
}

}  // namespace

void validate_sampling(const SamplingParams& p) {
  FP4MOE_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature {} must be >= 0", p.temperature);
  FP4MOE_CHECK(p.top_k >= 0, "top_k {} must be >= 0 (0: off)", p.top_k);
  FP4MOE_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p {} must be in (0, 1]", p.top_p);
  FP4MOE_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p {} must be in [0, 1]", p.min_p);
  FP4MOE_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
               "repetition_penalty {} must be > 0", p.repetition_penalty);
  FP4MOE_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty),
               "presence / frequency penalties must be finite");
  FP4MOE_CHECK(p.logprobs_top_n >= -1 && p.logprobs_top_n <= 20, "logprobs top_n {} must be in [0, 20]",
               p.logprobs_top_n);
}

namespace {

// Steps 1 and 3 of the header: penalties, then / temperature (unless greedy); and log Z.
struct Processed {
  std::vector<float> l;
  double log_z = 0.0;
};

Processed process(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                  const std::vector<int32_t>& output) {
  validate_sampling(p);
  FP4MOE_CHECK(vocab >= 1, "sampling over a vocabulary of {}", vocab);
  Processed r;
  std::vector<float>& l = r.l;
  l.assign(logits, logits + vocab);
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(static_cast<size_t>(vocab), 0);
    for (const auto* list : {&prompt, &output})
      for (int32_t t : *list)
        if (t >= 0 && t < vocab) seen[size_t(t)] = 1;
    for (int64_t i = 0; i < vocab; ++i)
      if (seen[size_t(i)]) l[size_t(i)] = l[size_t(i)] > 0 ? l[size_t(i)] / p.repetition_penalty : l[size_t(i)] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int64_t> count;
    for (int32_t t : output)
      if (t >= 0 && t < vocab) ++count[t];
    for (const auto& [t, n] : count) l[size_t(t)] -= p.presence_penalty + p.frequency_penalty * float(n);
  }
  if (p.temperature != 0.0f)
    for (float& x : l) x /= p.temperature;
  const float mx = *std::max_element(l.begin(), l.end());
  double z = 0.0;
  for (float x : l) z += std::exp(double(x) - double(mx));
  r.log_z = double(mx) + std::log(z);
  return r;
}

// Step 4: the kept tokens in rank order with their (unnormalised) probabilities.
struct Kept {
  std::vector<int32_t> order;
  std::vector<double> prob;
  size_t n = 0;
  double mass = 0.0;  // of the n kept
};

Kept truncate(const Processed& pr, const SamplingParams& p) {
  const std::vector<float>& l = pr.l;
  const int64_t vocab = int64_t(l.size());
  Kept k;
  std::vector<int32_t>& order = k.order;
  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const size_t keep_k = p.top_k > 0 ? size_t(std::min<int64_t>(p.top_k, vocab)) : size_t(vocab);
  if (keep_k < order.size()) {
    std::nth_element(order.begin(), order.begin() + ptrdiff_t(keep_k) - 1, order.end(), rank_by(l));
    order.resize(keep_k);
  }
  std::sort(order.begin(), order.end(), rank_by(l));
  std::vector<double>& prob = k.prob;
  prob.resize(order.size());
  double mass = 0.0;
  for (size_t i = 0; i < order.size(); ++i) mass += prob[i] = std::exp(double(l[size_t(order[i])]) - pr.log_z);
  size_t n = order.size();
  if (p.top_p < 1.0f) {
    double c = 0.0;
    for (size_t i = 0; i < n; ++i) {
      c += prob[i] / mass;
      if (c >= double(p.top_p)) {
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * prob[0];
    size_t m = 1;
    while (m < n && prob[m] >= floor) ++m;
    n = m;
  }
  k.n = n;
  for (size_t i = 0; i < n; ++i) k.mass += prob[i];
  return k;
}

void fill_logprobs(SampledToken& out, const Processed& pr, const SamplingParams& p) {
  if (p.logprobs_top_n < 0) return;
  const std::vector<float>& l = pr.l;
  auto logprob = [&](int32_t t) { return float(double(l[size_t(t)]) - pr.log_z); };
  out.logprob = logprob(out.token);
  if (p.logprobs_top_n > 0) {
    std::vector<int32_t> all(l.size());
    std::iota(all.begin(), all.end(), 0);
    const size_t n = size_t(std::min<int64_t>(p.logprobs_top_n, int64_t(l.size())));
    std::partial_sort(all.begin(), all.begin() + ptrdiff_t(n), all.end(), rank_by(l));
    for (size_t i = 0; i < n; ++i) out.top.emplace_back(all[i], logprob(all[i]));
  }
}

}  // namespace

SampledToken sample_cpu(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, uint64_t step) {
  const Processed pr = process(logits, vocab, p, prompt, output);
  SampledToken out;
  if (p.temperature == 0.0f) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    out.token = *std::min_element(order.begin(), order.end(), rank_by(pr.l));
  } else {
    const Kept k = truncate(pr, p);
    const double u = uniform(p.seed, step) * k.mass;
    double c = 0.0;
    out.token = k.order[k.n - 1];
    for (size_t i = 0; i < k.n; ++i) {
      c += k.prob[i];
      if (c > u) {
        out.token = k.order[i];
        break;
      }
    }
  }
  fill_logprobs(out, pr, p);
  return out;
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& p,
                                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  FP4MOE_CHECK(p.temperature > 0.0f, "sampling_distribution: greedy sampling has no distribution to draw from");
  const Processed pr = process(logits, vocab, p, prompt, output);
  const Kept k = truncate(pr, p);
  std::vector<double> d(static_cast<size_t>(vocab), 0.0);
  for (size_t i = 0; i < k.n; ++i) d[size_t(k.order[i])] = k.prob[i] / k.mass;
  return d;
}

SampledToken logprobs_of(const float* logits, int64_t vocab, const SamplingParams& p, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output, int32_t token) {
  FP4MOE_CHECK(token >= 0 && token < vocab, "logprobs_of: token {} outside the vocabulary", token);
  SampledToken out;
  out.token = token;
  if (p.logprobs_top_n >= 0) fill_logprobs(out, process(logits, vocab, p, prompt, output), p);
  return out;
}

double sampling_uniform(uint64_t seed, uint64_t step) { return uniform(seed, step); }

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
