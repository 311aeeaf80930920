// A rank's part of an MoE layer, cut from the whole layer by its RankShard: the routed experts
// it owns (--ep), the intermediate columns it owns (--tp with ep 1: MoE tensor parallel) and
// its share of the shared expert. Owned (contiguous) stacks only, the form the GPU uploads;
// the checkpoint path reads the same slices straight from the shards (read_plan.hpp).
#pragma once

#include "engine/dist/shard_plan.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::dist {

// Experts [r.begin, r.end) of a stack.
ExpertStack slice_experts(const ExpertStack& s, Range r);
// [E, 2I, H] gate|up stack -> gate rows r and up rows I + r: [E, 2·|r|, H].
ExpertStack slice_gate_up(const ExpertStack& s, Range r);
// [E, H, I] down stack -> columns r: [E, H, |r|]; r must fall on FP4 scale blocks.
ExpertStack slice_down(const ExpertStack& s, Range r);

// The layer rank `shard` computes: experts shard.experts (local ids 0..), intermediate
// shard.expert_inter, the shared expert's columns shard.shared_inter when with_shared (else
// none). The router is kept whole (replicated).
MoeLayerWeights rank_moe_layer(const MoeLayerWeights& w, const RankShard& shard, bool with_shared);

}  // namespace fp4moe::dist
