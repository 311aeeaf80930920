#include "tuner/tactic_cuda.hpp"

#ifdef FP4MOE_HAVE_CUDA

#include "core/error.hpp"
#include "tuner/plan_cache.hpp"

namespace fp4moe::tuner {

GemmProblem from_cuda_desc(const cuda::MoeGemmDesc& d, int top_k) {
  GemmProblem p;
  p.num_experts = d.num_experts;
  p.n = d.n;
  p.k = d.k;
  p.top_k = top_k;
  p.weight = d.weight;
  p.act = d.act == cuda::ActFormat::BF16 ? Act::BF16 : Act::NVFP4;
  p.epilogue = d.epilogue == cuda::Epilogue::None      ? Epi::None
               : d.epilogue == cuda::Epilogue::SiluMul ? Epi::SiluMul
                                                       : Epi::RowScale;
  return p;
}

cuda::MoeGemmDesc to_cuda_desc(const GemmProblem& p, int max_tokens) {
  cuda::MoeGemmDesc d;
  d.num_experts = p.num_experts;
  d.n = p.n;
  d.k = p.k;
  d.max_tokens = max_tokens;
  d.weight = p.weight;
  d.act = p.act == Act::BF16 ? cuda::ActFormat::BF16 : cuda::ActFormat::NVFP4_EMULATED;
  d.epilogue = p.epilogue == Epi::None      ? cuda::Epilogue::None
               : p.epilogue == Epi::SiluMul ? cuda::Epilogue::SiluMul
                                            : cuda::Epilogue::RowScale;
  return d;
}

cuda::TileConfig to_cuda_config(const Tactic& t) {
  cuda::TileConfig c;
  switch (t.impl) {
    case Impl::Sm90Wgmma: c.kernel = cuda::GemmKernel::Sm90Wgmma; break;
    case Impl::Sm90Decode: c.kernel = cuda::GemmKernel::Sm90Decode; break;
    case Impl::DequantCublas: c.kernel = cuda::GemmKernel::DequantCublas; break;
    case Impl::Generic: c.kernel = cuda::GemmKernel::Generic; break;
    default: FP4MOE_FAIL("{} is listed for feasibility only: it has no kernel", t.name());
  }
  c.block_m = t.cfg.block_m;
  c.block_n = t.cfg.block_n;
  c.block_k = t.cfg.block_k;
  c.stages = t.cfg.stages;
  c.split_k = t.cfg.split_k;
  c.cluster = t.cfg.cluster;
  return c;
}

Tactic from_cuda_config(const cuda::TileConfig& c) {
  Tactic t;
  switch (c.kernel) {
    case cuda::GemmKernel::Sm90Wgmma: t.impl = Impl::Sm90Wgmma; break;
    case cuda::GemmKernel::Sm90Decode: t.impl = Impl::Sm90Decode; break;
    case cuda::GemmKernel::DequantCublas: t.impl = Impl::DequantCublas; break;
    case cuda::GemmKernel::Generic: t.impl = Impl::Generic; break;
  }
  if (t.impl == Impl::Sm90Wgmma || t.impl == Impl::Sm90Decode)
    t.cfg = TileCfg{c.block_m, c.block_n, c.block_k, c.stages, c.split_k, c.cluster};
  return t;
}

cuda::TileConfig plan_for(const cuda::MoeGemmDesc& d, int64_t tokens, int top_k) {
  return to_cuda_config(plan_for(from_cuda_desc(d, top_k), tokens));
}

}  // namespace fp4moe::tuner

#endif
