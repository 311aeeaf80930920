#include "cli/modelopt_config.hpp"

namespace fp4moe::cli {

using json = nlohmann::json;

json modelopt_hf_quant_config(const ModelOptQuant& q) {
  return {{"producer", q.producer},
          {"quantization",
           {{"quant_algo", q.algo},
            {"kv_cache_quant_algo", nullptr},
            {"group_size", q.group_size},
            {"exclude_modules", q.exclude_modules}}}};
}

json modelopt_quantization_config(const ModelOptQuant& q) {
  const json fp4 = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", q.group_size}};
  json group = {{"weights", fp4}, {"targets", json::array({"Linear"})}};
  if (q.act_quant) group["input_activations"] = fp4;
  return {{"config_groups", {{"group_0", group}}},
          {"ignore", q.exclude_modules},
          {"quant_algo", q.algo},
          {"group_size", q.group_size},
          {"producer", q.producer},
          {"quant_method", "modelopt"}};
}

}  // namespace fp4moe::cli
