// choose_mla_prefill_form: the fitted time estimates of mla_prefill_form.hpp.
#include "cuda/attention/mla_prefill_form.hpp"

#include <algorithm>

namespace fp4moe::cuda::attention {

MlaPrefillChoice choose_mla_prefill_form(int64_t q_len, int64_t kv_len, KvElem kv_elem, int num_heads) {
  MlaPrefillChoice c;
  if (q_len <= 0 || kv_len <= 0) return c;
  const double q = double(std::min(q_len, kv_len)), L = double(kv_len), h = double(num_heads);
  const double pairs = q * L - q * (q - 1) / 2;                   // causal (query, key) pairs
  const double absorbed_flops = 2 * h * pairs * (512 + 64 + 512);  // qk 576, pv 512
  const double expanded_flops = 2 * h * pairs * (256 + 256) + 2 * L * 512 * h * (192 + 256);
  const bool fp8 = kv_elem == KvElem::FP8_E4M3;
  c.absorbed_us = (fp8 ? 46.0 : 20.0) + absorbed_flops / ((fp8 ? 152.0 : 580.0) * 1e6);
  c.expanded_us = 61.0 + expanded_flops / (640.0 * 1e6);
  c.form = c.expanded_us < c.absorbed_us ? MlaPrefillForm::Expanded : MlaPrefillForm::Absorbed;
  return c;
}

}  // namespace fp4moe::cuda::attention
