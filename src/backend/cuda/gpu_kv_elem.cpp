// The GPU runner's KV cache element (RunnerOptions::kv_elem): BF16, or FP8 E4M3 for the latent,
// the rope key and the index keys, with their scales (the options', or 1.0 with a warning).
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"

namespace fp4moe::engine::gpu {

KvElem parse_kv_cache_dtype(const std::string& name) {
  if (name == "auto" || name == "bf16") return KvElem::BF16;
  if (name == "fp8_e4m3") return KvElem::FP8_E4M3;
  FP4MOE_FAIL("--kv-cache-dtype {}: the GPU runner keeps auto (bf16), bf16 or fp8_e4m3", name);
}

void GpuRunner::Impl::choose_kv_elem() {
  FP4MOE_CHECK(opt.kv_elem == KvElem::BF16 || opt.kv_elem == KvElem::FP8_E4M3,
               "gpu runner: KV cache dtype {} (the GPU keeps bf16 or fp8_e4m3)", kv_elem_name(opt.kv_elem));
  kv_fp8 = opt.kv_elem == KvElem::FP8_E4M3;
  if (!kv_fp8) return;
  // Per-layer KV scales in the checkpoint (ModelOpt's k_scale / v_scale beside the attention
  // projections) are not read yet: refused rather than replaced by the defaults.
  for (const auto& f : ck->files())
    for (const TensorInfo& t : f->tensors()) {
      const std::string& n = t.name;
      const bool kv_scale_tensor = n.find("self_attn") != std::string::npos &&
                                   (n.ends_with("k_scale") || n.ends_with("v_scale") || n.ends_with("kv_scale"));
      FP4MOE_CHECK(!kv_scale_tensor,
                   "--kv-cache-dtype fp8_e4m3: the checkpoint has KV cache scales ({}); the GPU runner does not read "
                   "them yet, run with --kv-cache-dtype bf16",
                   n);
    }
  auto pick = [](float given, const char* what) {
    if (given == 0.0f) return 1.0f;
    FP4MOE_CHECK(std::isfinite(given) && given > 0.0f,
                 "--kv-cache-dtype fp8_e4m3: the {} scale {} must be positive and finite", what, given);
    return given;
  };
  ckv_scale = pick(opt.kv_ckv_scale, "latent (ckv)");
  kpe_scale = pick(opt.kv_kpe_scale, "rope key (kpe)");
  index_scale = pick(opt.kv_index_scale, "index key");
  const bool defaults = opt.kv_ckv_scale == 0.0f || opt.kv_kpe_scale == 0.0f || opt.kv_index_scale == 0.0f;
  const std::string algo = ck->quant().kv_cache_quant_algo;
  if (defaults && !opt.quiet)
    log_warn("--kv-cache-dtype fp8_e4m3: the checkpoint gives no KV cache scales (kv_cache_quant_algo {}); using "
             "scale 1.0 (SGLang's and vLLM's default)",
             algo.empty() ? "unset" : algo);
  kv_line = fmt::format("FP8 E4M3, scales ckv {} kpe {} index {}{}", ckv_scale, kpe_scale, index_scale,
                        defaults ? " (defaults)" : "");
}

}  // namespace fp4moe::engine::gpu
