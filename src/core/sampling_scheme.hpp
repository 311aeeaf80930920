// The one seeded draw of the engine, shared by the CPU sampler (cpu/sampling_cpu.hpp) and the
// device sampler (cuda/sampling/): the counter-based random stream, the Gumbel key, the
// fixed-point masses. Plain integer / IEEE float code, compiled by g++ and nvcc alike (FP4MOE_HD).
//
// One row (a request's logits after the lm_head, F32 [vocab]), parameters cpu::SamplingParams:
//   1. penalties (the vLLM / OpenAI definitions), from the request's token lists:
//        repetition_penalty p (p != 1): every token seen in the prompt OR the output so far:
//          logit > 0 ? logit / p : logit · p
//        presence / frequency: logit −= presence + frequency · (count of the token in the output)
//   2. greedy (temperature 0 or top_k 1): the highest logit, ties to the lower id. Done.
//   3. x = logit / temperature (IEEE division);
//   4. truncation: keep the shortest prefix of the rank order (x descending, ties: lower id
//      first) allowed by top_k, top_p (mass of the top-k prefix, renormalised) and min_p
//      (x >= max + log(min_p), every tie kept); the masses are sums of fixed-point weights
//      (mass_weight: kMassOne · exp(x − max), truncated to an integer), so they do not depend
//      on the summation order (the same alone or batched, eager or replayed, CPU or GPU);
//   5. the draw is Gumbel-max over the kept tokens: token = argmax_i gumbel_key(x_i, bits_i),
//      key = x_i − log(−log u_i), ties to the lower id, with u_i from the 32 bits
//      sample_bits(seed, step, i) of Philox4x32-10 (step = the request's draw index: tokens
//      generated so far). It samples exactly softmax(x) restricted to the kept set (up to u's
//      2^-24 grid), needs no sort and no prefix sum (one pass over the row on the GPU), and is
//      fixed by (seed, step): a request draws the same token alone or batched, on any thread
//      count, eager or from a CUDA graph, on the CPU or the GPU.
// Logprobs: x − (max + log(Σ mass_weight / kMassOne)) over the whole vocabulary (after steps 1
// and 3; greedy rows at temperature 1), before truncation: of the chosen token, and the top n.
//
// CPU and GPU differ only where their logf / expf differ in the last ulp (both within 1 ulp
// of the exact value) or where their logits differ: cpu::SampledToken reports how close each
// decision came (draw_margin, cut_margin) so that a test can tell such a near tie from a wrong
// token — see cpu/sampling_cpu.hpp for the margin a comparison must respect.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.hpp"
#include "core/sampling_params.hpp"

namespace fp4moe::cpu {

// ---- Philox4x32-10 (Salmon et al., SC'11): counter (4 x 32 bits) + key (2 x 32) -> 4 x 32 ----
struct Philox4 {
  uint32_t v[4];
};

FP4MOE_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

FP4MOE_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The 32 random bits of token i at draw `step` of the request with `seed`: word i % 4 of
// Philox(counter = (i / 4, step lo, step hi, 0x53414D50 'SAMP'), key = seed).
FP4MOE_HD uint32_t sample_bits(uint64_t seed, uint64_t step, uint32_t i) {
  const Philox4 r = philox4x32_10(i >> 2, uint32_t(step), uint32_t(step >> 32), 0x53414D50u, uint32_t(seed),
                                  uint32_t(seed >> 32));
  return r.v[i & 3];
}

// (2j + 1) / 2^24 for the top 23 bits j: exactly representable, never 0 or 1.
FP4MOE_HD float bits_to_open_uniform(uint32_t bits) {
  return float(((bits >> 9) << 1) | 1u) * (1.0f / 16777216.0f);
}

// Fixed-point probability weights: w = floor(kMassOne · exp(x − max)) in [0, 2^40]; a vocabulary
// of up to 2^23 tokens sums without overflow in 64 bits. NaN (x or max non-finite) weighs 0.
inline constexpr double kMassOne = 1099511627776.0;  // 2^40

FP4MOE_HD uint64_t mass_weight(float x, float m) {
  const float e = expf(x - m);
  return e == e ? uint64_t(double(e) * kMassOne) : 0u;
}

// Step 5's key of a token with scaled logit x and random bits `bits`: x − log(−log u). The
// Gumbel part lies in [−2.82, 16.64] for the grid's u, so a token whose x + kGumbelBound is
// below a key already found cannot beat it (the one-pass skip).
inline constexpr float kGumbelBound = 17.0f;
FP4MOE_HD float gumbel_key(float x, uint32_t bits) {
  const float u = bits_to_open_uniform(bits);
  const float e = -logf(u);
  return x - logf(e);
}

// A uniform double in [0, 1) (53 bits) of the same stream, for draws that are not per token
// (speculative decoding's accept / residual / draft streams, cpu/sampling_cpu.hpp's
// sampling_uniform): counter (0xFFFFFFFF, step lo, step hi, 'SAMP'), which no token's counter
// (i / 4 < 2^21) reaches.
FP4MOE_HD double uniform_53(uint64_t seed, uint64_t step) {
  const Philox4 r = philox4x32_10(0xFFFFFFFFu, uint32_t(step), uint32_t(step >> 32), 0x53414D50u, uint32_t(seed),
                                  uint32_t(seed >> 32));
  const uint64_t bits = (uint64_t(r.v[0]) << 21) ^ (uint64_t(r.v[1]) >> 11);
  return double(bits & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Larger float -> larger key (−0 < +0); NaN -> 0, below every number.
FP4MOE_HD uint32_t float_order_key(float f) {
  if (f != f) return 0u;
  uint32_t b;
  __builtin_memcpy(&b, &f, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float of a (non-NaN) order key.
FP4MOE_HD float float_from_order_key(uint32_t key) {
  const uint32_t b = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  float f;
  __builtin_memcpy(&f, &b, 4);
  return f;
}

}  // namespace fp4moe::cpu
