#include "engine/sampling_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"

namespace fp4moe::engine {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void apply_penalties(std::span<float> logits, const SampleSpec& spec) {
  const SamplingParams& p = *spec.params;
  const int64_t vocab = int64_t(logits.size());
  if (p.repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(size_t(vocab), 0);
    for (auto list : {spec.prompt, spec.generated})
      for (int32_t t : list)
        if (t >= 0 && t < vocab) seen[size_t(t)] = 1;
    for (int64_t v = 0; v < vocab; ++v)
      if (seen[size_t(v)])
        logits[size_t(v)] = logits[size_t(v)] > 0 ? logits[size_t(v)] / p.repetition_penalty
                                                  : logits[size_t(v)] * p.repetition_penalty;
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : spec.generated)
      if (t >= 0 && t < vocab) ++counts[t];
    for (auto [t, c] : counts) logits[size_t(t)] -= p.frequency_penalty * float(c) + p.presence_penalty;
  }
}

}  // namespace

double sampling_uniform(uint64_t seed, int32_t index) {
  const uint64_t bits = splitmix64(seed ^ splitmix64(uint64_t(uint32_t(index)) + 0x632BE59BD9B4E019ull));
  return double(bits >> 11) * 0x1.0p-53;
}

GeneratedToken sample_logits_cpu(std::span<float> logits, const SampleSpec& spec) {
  FP4MOE_CHECK(!logits.empty() && spec.params, "sampling needs logits and parameters");
  const SamplingParams& p = *spec.params;
  const size_t vocab = logits.size();
  GeneratedToken out;

  // Raw log-softmax for the logprobs (before penalties and temperature).
  std::vector<float> logprobs;
  if (spec.top_logprobs >= 0) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(double(l - mx));
    const float lse = mx + float(std::log(sum));
    logprobs.resize(vocab);
    for (size_t v = 0; v < vocab; ++v) logprobs[v] = logits[v] - lse;
  }

  apply_penalties(logits, spec);

  if (p.greedy()) {
    out.id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // first of equals
  } else {
    // Candidates sorted by logit (ties by id), then top-k, softmax at the temperature, top-p, min-p.
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    size_t keep = vocab;
    if (p.top_k > 0) keep = std::min(keep, size_t(p.top_k));
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
    };
    if (keep < vocab) {
      std::partial_sort(order.begin(), order.begin() + int64_t(keep), order.end(), by_logit);
      order.resize(keep);
    } else {
      std::sort(order.begin(), order.end(), by_logit);
    }
    std::vector<double> prob(order.size());
    const double top = logits[size_t(order[0])];
    double sum = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      prob[i] = std::exp((double(logits[size_t(order[i])]) - top) / double(p.temperature));
      sum += prob[i];
    }
    for (double& x : prob) x /= sum;
    size_t n = order.size();
    if (p.top_p < 1.0f) {
      double cum = 0;
      for (size_t i = 0; i < n; ++i) {
        cum += prob[i];
        if (cum >= double(p.top_p)) {
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
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += prob[i];
    const double u = sampling_uniform(p.seed, spec.output_index) * total;
    double cum = 0;
    out.id = order[n - 1];
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (u < cum) {
        out.id = order[i];
        break;
      }
    }
  }

  if (spec.top_logprobs >= 0) {
    out.logprob = logprobs[size_t(out.id)];
    const size_t k = std::min(vocab, size_t(spec.top_logprobs));
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + int64_t(k), ids.end(), [&](int32_t a, int32_t b) {
      return logprobs[size_t(a)] != logprobs[size_t(b)] ? logprobs[size_t(a)] > logprobs[size_t(b)] : a < b;
    });
    for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], logprobs[size_t(ids[i])]});
  }
  return out;
}

}  // namespace fp4moe::engine
