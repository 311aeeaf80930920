// The sm90 kernels' weight re-layout on the host (plain C++, no CUDA runtime: CPU-only builds
// compile it into their tests). FP4 experts in the checkpoint layout (an owned ExpertStack, or
// a view-mode one over the mmap'd shards, read through Fp4ExpertRows) → the chunks of
// sm90_tile_layout.hpp, one 128-row tile of one expert at a time, so an upload can stream the
// re-laid bytes through pinned staging without a host copy of the layer (weight_layout.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/moe_gemm/moe_gemm_types.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

// Throws fp4moe::Error unless `w` can be re-laid: FP4, N % 128 == 0, K % 64 == 0, owned arrays
// (or views) that match [E, N, K].
void check_relayout_sm90(const ExpertStack& w);
// Bytes of one re-laid 128-row tile of an expert (K/64 chunks of 4608 B); an expert has N/128.
size_t sm90_row_tile_bytes(int64_t k);
// Row tile rt of expert `x` (of a stack [-, n, k] that passed check_relayout_sm90) into `out`
// (sm90_row_tile_bytes(k) bytes). Throws on a scale the chunk cannot encode (NaN, MXFP4
// outside [2^-118, 2^8]). `expert` only names the expert in errors.
void relayout_row_tile_sm90(const Fp4ExpertRows& x, WeightFormat format, int64_t n, int64_t k, int64_t rt,
                            Epilogue epilogue, int64_t expert, uint8_t* out);
// The whole stack re-laid, [E, N/128, K/64, 4608 B] (parallel over tiles).
std::vector<uint8_t> relayout_weights_sm90(const ExpertStack& w, Epilogue epilogue);

}  // namespace fp4moe::cuda
