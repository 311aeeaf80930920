// The two quantization configs of a ModelOpt checkpoint, as its export writes them:
// hf_quant_config.json ({"producer", "quantization": {quant_algo, group_size, exclude_modules}})
// and config.json's "quantization_config" (config_groups, ignore, quant_algo, quant_method
// "modelopt"). Used by `quantize` and `make-synthetic`.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::cli {

struct ModelOptQuant {
  std::string algo;                          // "NVFP4" (W4A4), "W4A16_NVFP4", "W4A16_MXFP4"
  int group_size = 16;
  bool act_quant = false;                    // W4A4: a config group for the input activations
  std::vector<std::string> exclude_modules;  // module names or globs left unquantized
  nlohmann::json producer;                   // {"name", "version"}
};

nlohmann::json modelopt_hf_quant_config(const ModelOptQuant& q);
nlohmann::json modelopt_quantization_config(const ModelOptQuant& q);

}  // namespace fp4moe::cli
