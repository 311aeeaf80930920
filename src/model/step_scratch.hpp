// Per-step state shared by the layers of one Model::step (internal to src/model).
#pragma once

#include <cstdint>

#include "model/model.hpp"

namespace fp4moe::model {

struct Model::Step {
  float* cos = nullptr;     // [T, qk_rope_dim / 2]
  float* sin = nullptr;     // [T, qk_rope_dim / 2]
  int32_t* topk = nullptr;  // [T, topk_k]: the last "full" indexer layer's selection
  int64_t topk_k = 0;
  bool have_topk = false;
};

}  // namespace fp4moe::model
