#include "cpu/scale_tables.hpp"

#include "format/codecs.hpp"

namespace fp4moe::cpu {

ScaleTable make_scale_table(Fp4Format format, float global_scale) {
  if (format == Fp4Format::MXFP4) return kE8M0Table;
  ScaleTable t;
  for (size_t c = 0; c < 256; ++c) t[c] = kE4M3Table[c] * global_scale;
  return t;
}

}  // namespace fp4moe::cpu
