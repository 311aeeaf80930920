// Folding the shared expert into the routed grouped GEMMs as always-selected experts.
//
// A shared MLP of intermediate SI = n_sh * I is the sum of n_sh MLPs of intermediate I:
// piece j takes gate rows [j*I, (j+1)*I) and the matching up rows [SI + j*I, SI + (j+1)*I)
// of gate_up, and the K-columns [j*I, (j+1)*I) of down, so
//   down(SiLU(gate x) * up x) = sum_j down_j(SiLU(gate_j x) * up_j x).
// Each piece is an expert of the routed shape ([2I, H] and [H, I]) with the shared
// expert's global scale; the layer uploads routed + pieces as ONE weight set of E + n_sh
// experts and gives every token n_sh extra rows (experts E..E+n_sh-1, weight 1).
#pragma once

#include <cstdint>
#include <string>

#include "format/moe_layer.hpp"

namespace fp4moe::moe {

// n_sh = shared_inter / inter when the shared expert can be folded (same FP4 format as the
// routed experts, shared_inter % inter == 0, n_sh <= max_pieces); else 0 and *why (if given)
// says why not. 0 without reason when there is no shared expert.
int64_t shared_fold_pieces(const MoeLayerWeights& w, int64_t max_pieces, std::string* why = nullptr);

struct SharedPieces {
  ExpertStack w13;  // [n_sh, 2I, H]: piece j = gate rows j*I.., up rows SI + j*I..
  ExpertStack w2;   // [n_sh, H, I]:  piece j = down columns j*I..
};
// Splits the shared expert into n_sh pieces (host copies: the size of the shared expert).
SharedPieces split_shared_expert(const MoeLayerWeights& w, int64_t n_sh);

}  // namespace fp4moe::moe
