// Internal launchers of cuda/permute (not part of the public API in permute.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/permute/permute.hpp"

namespace fp4moe::cuda::permute_detail {

// The fused small path: pairs <= kPermuteFusedMaxPairs, E + X <= kMaxPermuteExperts. One
// launch: every CTA rebuilds the permutation in shared memory; CTA 0 writes the maps and
// offsets; all CTAs gather their rows (when a.x is set).
void launch_permute_small(const PermuteArgs& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::permute_detail
