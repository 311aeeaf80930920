#include "engine/dist/parallel_options.hpp"

#include "core/error.hpp"
#include "format/checkpoint.hpp"

namespace fp4moe::dist {

void require_single_gpu(const std::string& model_dir, const ParallelConfig& par) {
  validate_parallel(par);
  if (par.single()) return;
  const auto ck = Checkpoint::open(model_dir);
  plan_shards(model::parse_mla_model_config(ck->config_json(), ck->config(), model_dir), par);
  FP4MOE_FAIL("{}", kMultiGpuNotBuilt);
}

}  // namespace fp4moe::dist
