// libFuzzer target: config.json text through parse_model_config + parse_mla_model_config.
// Any input must give a config or an fp4moe::Error, never a crash or another exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "model/model_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const fp4moe::ModelConfig base = fp4moe::parse_model_config(j, "config.json");
    (void)fp4moe::model::parse_mla_model_config(j, base, "config.json");
  } catch (const fp4moe::Error&) {
  }
  return 0;
}
