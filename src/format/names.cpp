#include "format/fp4.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe {

std::string_view fp4_format_name(Fp4Format f) { return f == Fp4Format::NVFP4 ? "nvfp4" : "mxfp4"; }

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::NVFP4: return "nvfp4";
    case WeightFormat::MXFP4: return "mxfp4";
    case WeightFormat::BF16: return "bf16";
  }
  return "?";
}

}  // namespace fp4moe
