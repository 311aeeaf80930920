// Random MoE layers: see random_layer.hpp.
#include "moe/random_layer.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/threads.hpp"

namespace fp4moe::moe {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr int64_t kChunk = 1 << 20;  // bytes per RNG stream: results do not depend on threads

// fill(i, rnd) writes element i from 64 random bits.
template <typename T, typename F>
void fill_parallel(std::vector<T>& v, uint64_t seed, F gen) {
  const int64_t n = int64_t(v.size());
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, default_num_threads(), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      uint64_t s = seed ^ (uint64_t(c) * 0xd1b54a32d192ed03ull);
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) v[size_t(i)] = gen(splitmix64(s));
    }
  });
}

ExpertStack random_stack(WeightFormat f, int64_t experts, int64_t n, int64_t k, uint64_t seed) {
  FP4MOE_CHECK(f != WeightFormat::BF16, "random_moe_layer: BF16 experts are not generated here");
  ExpertStack s;
  s.format = f;
  s.num_experts = experts;
  s.n = n;
  s.k = k;
  const int64_t block = s.block();
  FP4MOE_CHECK(k % block == 0, "random_moe_layer: K = {} is not a multiple of {}", k, block);
  s.packed.resize(size_t(experts * n * k / 2));
  s.scales.resize(size_t(experts * n * k / block));
  s.global_scale.assign(size_t(experts), 1.0f);
  // Random E2M1 codes have rms ~2.9; scales rms ~1.2: aim at weights of rms 1/sqrt(K).
  const double target = 1.0 / (3.5 * std::sqrt(double(k)));
  fill_parallel(s.packed, seed * 3 + 1, [](uint64_t r) { return uint8_t(r >> 24); });
  if (f == WeightFormat::NVFP4) {
    // E4M3 codes with exponent field 6..8 (2^-1 .. 2^1 times 1.mmm).
    fill_parallel(s.scales, seed * 3 + 2, [](uint64_t r) {
      const uint32_t e = 6 + uint32_t((r >> 20) % 3), m = uint32_t(r >> 40) & 7u;
      return uint8_t((e << 3) | m);
    });
    for (int64_t e = 0; e < experts; ++e) s.global_scale[size_t(e)] = float(target);
  } else {
    const int center = 127 + int(std::lround(std::log2(target)));
    fill_parallel(s.scales, seed * 3 + 2, [center](uint64_t r) { return uint8_t(center - 1 + int((r >> 20) % 3)); });
  }
  return s;
}

}  // namespace

MoeConfig glm5_moe_config() {
  MoeConfig c;
  c.hidden = 6144;
  c.inter = 2048;
  c.num_experts = 256;
  c.top_k = 8;
  c.n_group = 1;
  c.topk_group = 1;
  c.scoring = ScoringFunc::Sigmoid;
  c.norm_topk_prob = true;
  c.routed_scaling = 2.5f;
  c.shared_inter = 2048;
  return c;
}

MoeLayerWeights random_moe_layer(const MoeConfig& cfg, uint64_t seed, WeightFormat format) {
  MoeLayerWeights w;
  w.cfg = cfg;
  const int64_t E = cfg.num_experts, H = cfg.hidden, I = cfg.inter;
  w.router_w.resize(size_t(E * H));
  const float a = float(std::sqrt(3.0 / double(H)));
  fill_parallel(w.router_w, seed * 7 + 11, [a](uint64_t r) { return a * (float(r >> 40) / float(1 << 24) * 2 - 1); });
  w.router_bias.resize(static_cast<size_t>(E));
  fill_parallel(w.router_bias, seed * 7 + 12,
                [](uint64_t r) { return 0.05f * (float(r >> 40) / float(1 << 24) * 2 - 1); });
  w.w13 = random_stack(format, E, 2 * I, H, seed * 7 + 13);
  w.w2 = random_stack(format, E, H, I, seed * 7 + 14);
  if (cfg.shared_inter > 0) {
    w.shared_w13 = random_stack(format, 1, 2 * cfg.shared_inter, H, seed * 7 + 15);
    w.shared_w2 = random_stack(format, 1, H, cfg.shared_inter, seed * 7 + 16);
  }
  return w;
}

void shared_expert_to_bf16(MoeLayerWeights& w) {
  for (std::optional<ExpertStack>* s : {&w.shared_w13, &w.shared_w2}) {
    if (!*s || !(*s)->is_fp4()) continue;
    ExpertStack& st = **s;
    FP4MOE_CHECK(st.num_experts == 1 && !st.is_view(), "shared_expert_to_bf16: one owned FP4 expert expected");
    ExpertStack b;
    b.format = WeightFormat::BF16;
    b.num_experts = 1;
    b.n = st.n;
    b.k = st.k;
    b.bf16.resize(size_t(st.n * st.k));
    dequantize_rows_bf16(st.expert(0), 0, st.n, b.bf16.data());
    st = std::move(b);
  }
}

}  // namespace fp4moe::moe
