// What each rank reads from the checkpoint's shards: per tensor the file and the byte ranges
// of the rank's slice, computed from the safetensors headers (format/) and the shard plan,
// so that a rank reads only its slices (pread of these ranges, no whole-file mapping needed).
//
// A tensor is read whole (replicated parts, scalars such as weight_scale_2 / input_scale, the
// experts a rank owns), by rows (row slice: one contiguous range) or by columns (column slice
// of a row-major [n, m] tensor: n ranges of equal length at a fixed stride), or not at all
// (another rank's experts). Column slices of packed FP4 weights and of block scales are
// computed in stored columns (k/2 bytes, k/block scales); a cut inside a stored column fails
// with one line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/dist/shard_plan.hpp"
#include "format/checkpoint.hpp"

namespace fp4moe::dist {

enum class SliceKind : uint8_t { Whole, Rows, Cols, Skip };
std::string_view slice_kind_name(SliceKind k);

// Byte ranges [offset + i·stride, offset + i·stride + length) of the file, i < count.
struct StridedBytes {
  uint64_t offset = 0, length = 0, stride = 0, count = 0;
  uint64_t total() const { return length * count; }
};

struct TensorRead {
  std::string name;
  std::string file;         // path of the shard
  SliceKind kind = SliceKind::Whole;
  Range logical;            // rows (Rows) or logical columns (Cols) of the linear
  std::vector<int64_t> shape;  // shape of the slice as stored (what the rank's buffer holds)
  StridedBytes bytes;       // in the file; count 0 for Skip
};

struct RankReadPlan {
  int64_t rank = 0;
  std::vector<TensorRead> reads;  // every tensor of the checkpoint, in name order
  uint64_t bytes() const;         // what this rank reads
};

// How a tensor name is split (exposed for tests and messages): the slice kind and range of the
// linear it belongs to, with the linear's logical [n, k] (0 when not a sliced linear).
struct TensorSplit {
  SliceKind kind = SliceKind::Whole;
  Range range;
  int64_t n = 0, k = 0;
};
TensorSplit tensor_split(const std::string& name, const model::MlaModelConfig& cfg, const RankShard& shard);

RankReadPlan plan_rank_reads(const Checkpoint& ck, const model::MlaModelConfig& cfg, const RankShard& shard);

}  // namespace fp4moe::dist
