// One MoE layer as the engine computes it: its configuration and its weights, stacked.
//
// Everything here is backend-neutral host data; cpu/ computes it, cuda/ + moe/ upload it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "format/fp4.hpp"

namespace fp4moe {

enum class WeightFormat : uint8_t { NVFP4, MXFP4, BF16 };
std::string_view weight_format_name(WeightFormat f);  // "nvfp4" | "mxfp4" | "bf16"

enum class ScoringFunc : uint8_t { Sigmoid, Softmax };

struct MoeConfig {
  int64_t hidden = 0;            // H
  int64_t inter = 0;             // I, per routed expert (moe_intermediate_size)
  int64_t num_experts = 0;       // E (routed)
  int64_t top_k = 0;
  int64_t n_group = 1;           // grouped top-k: experts split in n_group groups ...
  int64_t topk_group = 1;        // ... and only the best topk_group groups are eligible
  ScoringFunc scoring = ScoringFunc::Sigmoid;
  bool norm_topk_prob = true;    // renormalise the top-k weights to sum 1
  float routed_scaling = 1.0f;   // multiply the final top-k weights
  int64_t shared_inter = 0;      // shared expert intermediate (0 = no shared expert)
};

// Weights of E experts, each [n, k] (k is the reduction dim), either owned and stored
// contiguously:
//   FP4:  packed [E, n, k/2], scales [E, n, k/block], global_scale [E]
//   BF16: bf16 [E, n, k] (bf16 bits)
// or, for the CPU backend, viewed in place (mmap'd checkpoint bytes, no copy): `views` holds
// per expert `parts` matrices of n / parts rows each, stacked in order (w13: gate, then up),
// each with its own global scale. Owned arrays are empty then; the GPU upload paths need
// the owned form.
struct ExpertStack {
  WeightFormat format = WeightFormat::NVFP4;
  int64_t num_experts = 0, n = 0, k = 0;
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scales;
  std::vector<float> global_scale;
  std::vector<uint16_t> bf16;
  // The activations' static NVFP4 global for W4A4 (ModelOpt's input_scale = calibrated amax /
  // (6 · 448)): the largest of the stack's experts' (their input is one activation tensor);
  // 0 when the checkpoint has none (a W4A4 GEMM then derives it from the amax per call).
  float input_scale = 0.0f;

  struct PartView {
    const uint8_t* packed = nullptr;  // FP4 [n / parts, k/2]
    const uint8_t* scales = nullptr;  // FP4 [n / parts, k/block]
    const uint16_t* bf16 = nullptr;   // BF16 [n / parts, k]
    float global_scale = 1.0f;
  };
  int64_t parts = 1;
  std::vector<PartView> views;  // [num_experts * parts] in view mode, else empty

  bool is_view() const { return !views.empty(); }
  bool is_fp4() const { return format != WeightFormat::BF16; }
  Fp4Format fp4_format() const { return format == WeightFormat::MXFP4 ? Fp4Format::MXFP4 : Fp4Format::NVFP4; }
  int64_t block() const { return fp4_block_size(fp4_format()); }
  Fp4MatrixView expert(int64_t e) const {  // FP4 only
    return {fp4_format(), n, k, packed.data() + e * n * (k / 2),
            scales.data() + e * n * (k / block()), global_scale[size_t(e)]};
  }
  const uint16_t* expert_bf16(int64_t e) const { return bf16.data() + e * n * k; }
  size_t weight_bytes_per_expert() const {  // bytes a GEMM must read for one expert
    return is_fp4() ? size_t(n * k / 2 + n * k / block() + 4) : size_t(n * k * 2);
  }
};

// Expert e of an FP4 stack, owned or view mode, as the owned stack that
// Checkpoint::load_moe_layer builds holds it: row r's packed bytes (k/2), its block scales
// (k/block) and the expert's one global scale. In view mode the parts' globals are unified to
// the largest (as load_moe_layer does): a part with a smaller global has its block scales
// multiplied by (g_part / g_max) and re-rounded to E4M3 (scale() applies it). So uploads can
// stream one expert (or one row) at a time from the mmap'd checkpoint with the bytes of the
// owned path, without a host copy of the layer.
class Fp4ExpertRows {
 public:
  Fp4ExpertRows(const ExpertStack& s, int64_t e);
  const uint8_t* packed(int64_t r) const {
    return packed_[size_t(r / n_part_)] + size_t(r % n_part_) * size_t(k_ / 2);
  }
  // Row r's block scales as stored (before the unification).
  const uint8_t* raw_scales(int64_t r) const {
    return scales_[size_t(r / n_part_)] + size_t(r % n_part_) * size_t(k_ / block_);
  }
  bool rescaled(int64_t r) const { return ratio_[size_t(r / n_part_)] != 1.0f; }
  // Block scale kb of row r after the unification. A NaN scale (E4M3 0x7F / 0xFF, E8M0 0xFF)
  // throws fp4moe::Error naming expert, row and block.
  uint8_t scale(int64_t r, int64_t kb) const {
    const uint8_t s = raw_scales(r)[kb];
    const float ratio = ratio_[size_t(r / n_part_)];
    return ratio == 1.0f && !is_nan(s) ? s : slow_scale(r, kb);
  }
  // Writes row r's k/block unified scales to out (checks NaN like scale()).
  void scales_row(int64_t r, uint8_t* out) const;
  float global_scale() const { return global_; }

 private:
  bool is_nan(uint8_t s) const { return nv_ ? (s & 0x7F) == 0x7F : s == 0xFF; }
  uint8_t slow_scale(int64_t r, int64_t kb) const;
  int64_t e_ = 0, k_ = 0, n_part_ = 0, block_ = 16;
  bool nv_ = true;
  float global_ = 1.0f;
  std::vector<const uint8_t*> packed_, scales_;
  std::vector<float> ratio_;
};

// An owned copy of a stack (view mode: the parts stacked per expert, FP4 globals unified as
// in Fp4ExpertRows; BF16 parts copied). Owned stacks are returned as they are. Byte-identical
// to what Checkpoint::load_moe_layer makes from the same tensors.
ExpertStack owned_expert_stack(const ExpertStack& s);

struct MoeLayerWeights {
  MoeConfig cfg;
  std::vector<float> router_w;     // [E, H] (logits = x · router_wᵀ, FP32)
  std::vector<float> router_bias;  // [E] e_score_correction_bias, used for selection only; may be empty
  ExpertStack w13;                 // [E, 2I, H]: rows [0, I) gate_proj, rows [I, 2I) up_proj
  ExpertStack w2;                  // [E, H, I]: down_proj
  std::optional<ExpertStack> shared_w13;  // [1, 2*SI, H] (same halves layout)
  std::optional<ExpertStack> shared_w2;   // [1, H, SI]
};

}  // namespace fp4moe
