#include "cpu/expert_quantize.hpp"

#include <cstring>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"

namespace fp4moe::cpu {

ExpertStack quantize_experts_nvfp4(const ExpertStack& s, int threads) {
  FP4MOE_CHECK(s.format == WeightFormat::BF16, "quantize experts: the stack is {}, not bf16", weight_format_name(s.format));
  FP4MOE_CHECK(s.num_experts >= 1 && s.n >= 1 && s.k >= 16 && s.k % 16 == 0,
               "quantize experts: [{}, {}, {}] (k must be a positive multiple of 16)", s.num_experts, s.n, s.k);
  FP4MOE_CHECK(s.parts >= 1 && s.n % s.parts == 0, "quantize experts: {} rows in {} parts", s.n, s.parts);
  const int64_t E = s.num_experts, n = s.n, k = s.k, part_rows = n / s.parts;
  if (s.is_view())
    FP4MOE_CHECK(int64_t(s.views.size()) == E * s.parts, "quantize experts: {} part views for {} experts x {} parts",
                 s.views.size(), E, s.parts);
  else
    FP4MOE_CHECK(int64_t(s.bf16.size()) == E * n * k, "quantize experts: {} values for [{}, {}, {}]", s.bf16.size(), E,
                 n, k);
  ExpertStack q;
  q.format = WeightFormat::NVFP4;
  q.num_experts = E, q.n = n, q.k = k;
  q.packed.resize(size_t(E * n * k / 2));
  q.scales.resize(size_t(E * n * k / 16));
  q.global_scale.resize(size_t(E));
  q.input_scale = 0.0f;  // no calibration: a W4A4 GEMM derives the activations' global per call
  // The rows of part p of expert e (BF16 bits).
  auto part = [&](int64_t e, int64_t p) -> const uint16_t* {
    return s.is_view() ? s.views[size_t(e * s.parts + p)].bf16 : s.bf16.data() + (e * n + p * part_rows) * k;
  };
  parallel_for(E, threads, 1, [&](int64_t e0, int64_t e1) {
    std::vector<float> w(size_t(n * k));  // one expert [n, k] in FP32
    for (int64_t e = e0; e < e1; ++e) {
      for (int64_t p = 0; p < s.parts; ++p) {
        const uint16_t* src = part(e, p);
        FP4MOE_CHECK(src, "quantize experts: expert {} part {} has no BF16 data", e, p);
        float* dst = w.data() + p * part_rows * k;
        for (int64_t i = 0; i < part_rows * k; ++i) dst[i] = bf16_to_float(src[i]);
      }
      Fp4Matrix m;
      try {
        m = quantize_nvfp4(w.data(), n, k);
      } catch (const Error& err) {
        throw Error(fmt::format("quantize experts: expert {}: {}", e, err.what()));
      }
      std::memcpy(q.packed.data() + e * n * k / 2, m.packed.data(), m.packed.size());
      std::memcpy(q.scales.data() + e * n * k / 16, m.scales.data(), m.scales.size());
      q.global_scale[size_t(e)] = m.global_scale;
    }
  });
  return q;
}

}  // namespace fp4moe::cpu
