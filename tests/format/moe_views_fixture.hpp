// A checkpoint folder holding one MoE layer (layer 1 of 2) at sizes the sm90 re-layout takes
// (H = 128, I = 64, 3 experts, a BF16 shared expert), in a TinyModel layout; experts 0 and 2
// have gate/up with different global scales (Checkpoint::load_moe_layer rescales them), expert
// 1 one shared global. view_layer() binds it in view mode as model::bind_weights does (the GPU
// runner's input), so tests can compare the streamed paths with load_moe_layer's owned copy.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "format/checkpoint.hpp"
#include "format/moe_layer.hpp"
#include "format/tiny_checkpoint.hpp"

namespace fp4moe::testing_ckpt {

struct MoeViewsFixture {
  static constexpr int64_t H = 128, I = 64, E = 3;

  static void write(Layout layout, const std::filesystem::path& dir) {
    TinyModel m(layout);
    m.tensors.clear();
    m.config["hidden_size"] = H;
    m.config["moe_intermediate_size"] = I;
    m.config["n_routed_experts"] = E;
    m.config["num_experts_per_tok"] = 2;
    m.config["n_group"] = 1;
    m.config["topk_group"] = 1;
    m.config["n_shared_experts"] = 1;
    const std::string M = "model.layers.1.mlp.";
    m.add_bf16(M + "gate.weight", {E, H});
    m.add_f32(M + "gate.e_score_correction_bias", {E});
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = fmt::format("{}experts.{}.", M, e);
      if (e == 1) {
        m.add_gate_up(p, I, H, 1.0f);
      } else {  // each its own global (from its amax): different
        m.add_linear(p + "gate_proj", I, H, 1.0f);
        m.add_linear(p + "up_proj", I, H, 3.0f);
      }
      m.add_linear(p + "down_proj", H, I, 2.0f);
    }
    for (const char* part : {"gate_proj", "up_proj"}) m.add_bf16(M + "shared_experts." + part + ".weight", {I, H});
    m.add_bf16(M + "shared_experts.down_proj.weight", {H, I});
    m.write(dir);
  }

  // E experts of `parts` linears [n_part, k] as a view-mode stack (model/weights.cpp's expert_stack).
  static ExpertStack view_stack(const Checkpoint& ck, const std::vector<std::vector<std::string>>& prefixes,
                                int64_t n_part, int64_t k) {
    ExpertStack s;
    s.num_experts = int64_t(prefixes.size());
    s.parts = int64_t(prefixes[0].size());
    s.n = n_part * s.parts;
    s.k = k;
    for (const auto& ps : prefixes)
      for (const std::string& p : ps) {
        const LinearTensors t = ck.find_linear(p, n_part, k);
        ExpertStack::PartView v;
        if (t.format == TensorGroupFormat::BF16) {
          s.format = WeightFormat::BF16;
          v.bf16 = reinterpret_cast<const uint16_t*>(t.wfile->bytes(*t.weight).data());
        } else {
          s.format = t.format == TensorGroupFormat::MXFP4 ? WeightFormat::MXFP4 : WeightFormat::NVFP4;
          v.packed = t.wfile->bytes(*t.weight).data();
          v.scales = t.sfile->bytes(*t.scales).data();
          v.global_scale = t.global;
        }
        s.input_scale = std::max(s.input_scale, t.input_scale);
        s.views.push_back(v);
      }
    return s;
  }

  // Layer `layer`'s experts and shared expert in view mode (router left empty).
  static MoeLayerWeights view_layer(const Checkpoint& ck, int64_t layer) {
    const int64_t e_count = ck.config().moe.num_experts, h = ck.config().moe.hidden, i = ck.config().moe.inter,
                  si = ck.config().moe.shared_inter;
    const std::string M = fmt::format("model.layers.{}.mlp.", layer);
    std::vector<std::vector<std::string>> w13, w2;
    for (int64_t e = 0; e < e_count; ++e) {
      const std::string p = fmt::format("{}experts.{}.", M, e);
      w13.push_back({p + "gate_proj", p + "up_proj"});
      w2.push_back({p + "down_proj"});
    }
    MoeLayerWeights w;
    w.cfg = ck.config().moe;
    w.w13 = view_stack(ck, w13, i, h);
    w.w2 = view_stack(ck, w2, h, i);
    const std::string S = M + "shared_experts.";
    w.shared_w13 = view_stack(ck, {{S + "gate_proj", S + "up_proj"}}, si, h);
    w.shared_w2 = view_stack(ck, {{S + "down_proj"}}, h, si);
    return w;
  }
};

}  // namespace fp4moe::testing_ckpt
