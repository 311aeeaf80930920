// The sharding arithmetic of multi-GPU runs (--tp N, --ep N): which part of every layer each
// rank owns. Pure arithmetic on the model config, no devices; the design is in README.md.
//
//   ranks    world = max(tp, ep); tp and ep are equal, or one of them is 1 (one group of
//            ranks on one host: rank r is GPU r).
//   --tp N   attention by heads (MLA: q_b_proj / q_proj rows, kv_b_proj rows, o_proj columns
//            of the rank's heads), dense MLP and shared expert by intermediate columns
//            (gate/up rows, down columns), lm_head by vocab rows; routed experts too by
//            intermediate columns when ep = 1 (MoE tensor parallel). Replicated: embeddings,
//            norms, q_a / kv_a projections (the latent is shared by all heads), the DSA
//            indexer, the router. Row-parallel outputs (o_proj, down) are summed over ranks
//            (all-reduce); lm_head slices are gathered.
//   --ep N   routed experts in contiguous blocks: rank r owns [r·⌊E/N⌋ + min(r, E mod N),
//            +⌊E/N⌋ + (r < E mod N)), so with E mod N ≠ 0 the first E mod N ranks own one more.
//   KV pool  per rank. MLA caches one latent per token for all heads, so TP does not split
//            it: every rank holds the whole latent + rope key (+ indexer key) of its layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"
#include "model/model_config.hpp"

namespace fp4moe::dist {

// [begin, end)
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  bool operator==(const Range&) const = default;
};

// Part `part` of n items split in `parts` contiguous blocks, the first n mod parts one longer.
Range split_block(int64_t n, int64_t parts, int64_t part);
// Part `part` of n items split in `parts` equal blocks; n % parts must be 0 (checked by callers).
Range split_even(int64_t n, int64_t parts, int64_t part);

enum class MoeComm : uint8_t {
  AllReduce,        // every rank runs its experts on all tokens; partial outputs summed
  DispatchCombine,  // tokens sent to the ranks owning their experts, outputs sent back
};
std::string_view moe_comm_name(MoeComm m);  // "all-reduce" | "dispatch-combine"

struct ParallelConfig {
  int64_t tp = 1, ep = 1;
  MoeComm moe_comm = MoeComm::AllReduce;
  int64_t world() const { return tp > ep ? tp : ep; }
  bool single() const { return tp == 1 && ep == 1; }
};

// Checks tp, ep >= 1 and their combination (not the model); one line on failure.
void validate_parallel(const ParallelConfig& p);

// What rank `rank` owns. Ranges are in the model's own units (heads, columns, rows, experts).
struct RankShard {
  int64_t rank = 0;
  Range heads;          // attention heads
  Range q_rows;         // q_b_proj (q_proj) rows: heads × qk_head_dim
  Range kv_b_rows;      // kv_b_proj rows: heads × (qk_nope + v_head)
  Range o_cols;         // o_proj columns: heads × v_head
  Range dense_inter;    // dense MLP: gate/up rows, down columns
  Range shared_inter;   // shared expert: gate/up rows, down columns
  Range vocab;          // lm_head rows
  Range experts;        // routed experts held (all of them with ep = 1)
  Range expert_inter;   // routed experts' gate/up rows and down columns (all with ep > 1 or tp = 1)
};

struct ShardPlan {
  ParallelConfig par;
  std::vector<RankShard> ranks;  // [world]
};

// The plan for a model; impossible splits fail with one line naming the dimension, e.g.
// "--tp 3: 64 attention heads are not divisible by 3".
ShardPlan plan_shards(const model::MlaModelConfig& cfg, const ParallelConfig& par);

// KV pool bytes per token per rank (all layers; the same on every rank, see above).
size_t kv_bytes_per_token_per_rank(const model::MlaModelConfig& cfg, KvElem elem, KvElem index_elem);

}  // namespace fp4moe::dist
