#include "cpu/sampling_scheme_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.hpp"
#include "cpu/sampling_cpu.hpp"

namespace fp4moe::cpu {

SamplingParams to_sampling_params(const SamplingRowParams& p) {
  SamplingParams c;
  c.temperature = p.temperature;
  c.top_k = p.top_k;
  c.top_p = p.top_p;
  c.min_p = p.min_p;
  c.repetition_penalty = p.repetition_penalty;
  c.presence_penalty = p.presence_penalty;
  c.frequency_penalty = p.frequency_penalty;
  c.seed = p.seed;
  c.logprobs_top_n = p.logprobs_top_n;
  return c;
}

void validate_row_params(const SamplingRowParams& p) { validate_sampling(to_sampling_params(p)); }

SchemeToken sample_scheme_cpu(const float* logits, int64_t vocab, const SamplingRowParams& p,
                              const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, uint64_t step) {
  validate_row_params(p);
  FP4MOE_CHECK(vocab >= 1 && vocab < (int64_t(1) << 23), "sampling over a vocabulary of {} (1 .. 2^23)", vocab);
  const size_t V = size_t(vocab);
  std::vector<float> x(logits, logits + V);
  // 1. penalties (cpu/sampling_cpu.hpp's definitions and float operations)
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
      if (count[t]) x[t] = x[t] - (p.presence_penalty + p.frequency_penalty * float(count[t]));
  }
  const bool greedy = p.temperature == 0.0f;
  if (!greedy)
    for (float& v : x) v = v / p.temperature;

  // Rank order: x descending (by the order key, NaN last), ties: the lower id.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint32_t> key(V);
  for (size_t i = 0; i < V; ++i) key[i] = float_order_key(x[i]);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return key[size_t(a)] > key[size_t(b)] || (key[size_t(a)] == key[size_t(b)] && a < b);
  });
  const float m = x[size_t(order[0])];
  auto weight = [&](size_t i) {
    const float d = x[i] - m;
    return uint64_t(double(std::exp(d)) * kMassOne);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();

  SchemeToken out;
  out.draw_margin = kInf;
  out.cut_margin = kInf;
  if (greedy) {
    out.token = order[0];
    out.kept = 1;
  } else {
    // 4. truncation: shortest rank prefix.
    const size_t n_k = p.top_k > 0 && p.top_k < vocab ? size_t(p.top_k) : V;
    size_t n = n_k;
    if (p.top_p < 1.0f) {
      uint64_t z_k = 0;
      for (size_t r = 0; r < n_k; ++r) z_k += weight(size_t(order[r]));
      const uint64_t target = std::min<uint64_t>(z_k, uint64_t(std::ceil(double(p.top_p) * double(z_k))));
      uint64_t s = 0;
      for (size_t r = 0; r < n_k; ++r) {
        const uint64_t before = s;
        s += weight(size_t(order[r]));
        if (s >= target) {
          n = r + 1;
          out.cut_margin = double(std::min(s - target, target - before)) / double(z_k);
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      const float cut = m + std::log(p.min_p);
      size_t kept = 0;
      while (kept < n && x[size_t(order[kept])] >= cut) ++kept;
      double margin = std::abs(double(x[size_t(order[kept - 1])]) - double(cut));
      if (kept < V) margin = std::min(margin, std::abs(double(x[size_t(order[kept])]) - double(cut)));
      out.cut_margin = std::min(out.cut_margin, margin / std::max(1.0, std::abs(double(cut))));
      n = kept;
    }
    out.kept = int64_t(n);
    // 5. Gumbel-max over the kept prefix.
    uint32_t best_key = 0, second_key = 0;
    float best = 0.0f, second = 0.0f;
    int32_t best_id = -1;
    bool has_second = false;
    for (size_t r = 0; r < n; ++r) {
      const int32_t i = order[r];
      const float u = bits_to_open_uniform(sample_bits(p.seed, step, uint32_t(i)));
      const float e = -std::log(u);
      const float g = x[size_t(i)] - std::log(e);
      const uint32_t k = float_order_key(g);
      if (best_id < 0 || k > best_key || (k == best_key && i < best_id)) {
        if (best_id >= 0) second_key = best_key, second = best, has_second = true;
        best_key = k, best = g, best_id = i;
      } else if (!has_second || k > second_key) {
        second_key = k, second = g, has_second = true;
      }
    }
    out.token = best_id;
    if (n > 1) out.draw_margin = double(best) - double(second);
  }
  if (p.logprobs_top_n >= 0) {
    uint64_t z = 0;
    for (size_t i = 0; i < V; ++i) z += weight(i);
    const double lse = double(m) + std::log(double(z) / kMassOne);
    auto lp = [&](int32_t t) { return float(double(x[size_t(t)]) - lse); };
    out.logprob = lp(out.token);
    const size_t top = std::min<size_t>(size_t(p.logprobs_top_n), V);
    for (size_t r = 0; r < top; ++r) out.top.emplace_back(order[r], lp(order[r]));
  }
  return out;
}

}  // namespace fp4moe::cpu
