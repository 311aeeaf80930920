// A tiny GLM-5-shaped checkpoint folder for tests (checkpoint_test, inspect_test): the
// real GLM-5 config.json with shrunk dimensions, written in any of the weight layouts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "format/fp4.hpp"
#include "format/safetensors.hpp"

namespace fp4moe::testing_ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline json glm5_config() {  // zai-org/GLM-5 (GlmMoeDsaForCausalLM), real values
  return json::parse(R"({
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
    "vocab_size": 154880, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "hidden_act": "silu",
    "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
    "v_head_dim": 256, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
    "max_position_embeddings": 202752, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "torch_dtype": "bfloat16"
  })");
}

// ---- synthetic checkpoint folders -------------------------------------------------------

enum class Layout { ModelOpt, Compressed, Mxfp4, Mxfp4Compressed, Bf16 };

struct RawTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A tiny GLM-5-shaped model: layer 0 dense, layer 1 MoE.
struct TinyModel {
  static constexpr int64_t H = 64, I = 32, E = 4, DenseI = 48, Vocab = 40, SI = 32;
  Layout layout = Layout::ModelOpt;
  std::mt19937 rng{7};
  std::map<std::string, RawTensor> tensors;
  json config;
  json quant;  // hf_quant_config.json content (ModelOpt) or config.json quantization_config

  explicit TinyModel(Layout l) : layout(l) {
    config = glm5_config();
    config["hidden_size"] = H;
    config["moe_intermediate_size"] = I;
    config["intermediate_size"] = DenseI;
    config["n_routed_experts"] = E;
    config["num_experts_per_tok"] = 2;
    config["n_group"] = 2;
    config["topk_group"] = 1;
    config["num_hidden_layers"] = 2;
    config["first_k_dense_replace"] = 1;
    config["vocab_size"] = Vocab;
    config["num_attention_heads"] = 4;
    config["num_key_value_heads"] = 4;
    add_bf16("model.embed_tokens.weight", {Vocab, H});
    add_bf16("lm_head.weight", {Vocab, H});
    add_bf16("model.norm.weight", {H});
    for (int l = 0; l < 2; ++l) add_bf16(fmt::format("model.layers.{}.input_layernorm.weight", l), {H});
    add_bf16("model.layers.0.mlp.gate_proj.weight", {DenseI, H});
    add_bf16("model.layers.0.mlp.up_proj.weight", {DenseI, H});
    add_bf16("model.layers.0.mlp.down_proj.weight", {H, DenseI});
    add_bf16("model.layers.1.mlp.gate.weight", {E, H});
    add_f32("model.layers.1.mlp.gate.e_score_correction_bias", {E});
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = fmt::format("model.layers.1.mlp.experts.{}.", e);
      add_gate_up(p, I, H, 1.0f + 0.1f * float(e));
      add_linear(p + "down_proj", H, I, 2.0f);
    }
    add_gate_up("model.layers.1.mlp.shared_experts.", SI, H, 0.5f);
    add_linear("model.layers.1.mlp.shared_experts.down_proj", H, SI, 0.5f);
    switch (layout) {
      case Layout::ModelOpt:
        quant = {{"producer", {{"name", "modelopt"}}},
                 {"quantization", {{"quant_algo", "W4A16_NVFP4"}, {"group_size", 16},
                                   {"exclude_modules", {"lm_head", "model.layers.0.*", "*mlp.gate"}}}}};
        break;
      case Layout::Compressed:
        quant = json::parse(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}, "ignore": ["lm_head"]})");
        break;
      case Layout::Mxfp4:
        quant = {{"quantization", {{"quant_algo", "W4A16_MXFP4"}, {"group_size", 32}}}};
        break;
      case Layout::Mxfp4Compressed:
        quant = json::parse(R"({"quant_method": "compressed-tensors", "config_groups": {"g":
            {"format": "mxfp4-pack-quantized", "weights": {"group_size": 32}}}})");
        break;
      case Layout::Bf16: break;
    }
  }

  float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }

  std::vector<float> random_matrix(int64_t n, int64_t k, float amp) {
    std::vector<float> w(size_t(n * k));
    for (float& x : w) x = amp * normal() / std::sqrt(float(k));
    return w;
  }
  void add_bf16(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    RawTensor t{DType::BF16, shape, std::vector<uint8_t>(size_t(2 * n))};
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = float_to_bf16(0.1f * normal());
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
    tensors[name] = std::move(t);
  }
  void add_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float> v = {}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (v.empty())
      for (int64_t i = 0; i < n; ++i) v.push_back(0.01f * normal());
    RawTensor t{DType::F32, shape, std::vector<uint8_t>(size_t(4 * n))};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    tensors[name] = std::move(t);
  }
  static RawTensor bytes_tensor(DType d, std::vector<int64_t> shape, const std::vector<uint8_t>& b) {
    return {d, std::move(shape), b};
  }
  static float amax(const std::vector<float>& w) {
    float a = 0.0f;
    for (float x : w) a = std::max(a, std::abs(x));
    return a;
  }
  // gate_proj and up_proj sharing one weight_scale_2 (from the larger amax), as quantize does.
  void add_gate_up(const std::string& p, int64_t n, int64_t k, float amp) {
    const std::vector<float> g = random_matrix(n, k, amp), u = random_matrix(n, k, 1.3f * amp);
    const float gs = nvfp4_global_scale_from_amax(std::max(amax(g), amax(u)));
    add_linear(p + "gate_proj", n, k, g, gs);
    add_linear(p + "up_proj", n, k, u, gs);
  }
  void add_linear(const std::string& prefix, int64_t n, int64_t k, float amp) {
    add_linear(prefix, n, k, random_matrix(n, k, amp), std::nullopt);
  }
  void add_linear(const std::string& prefix, int64_t n, int64_t k, const std::vector<float>& w,
                  std::optional<float> global) {
    switch (layout) {
      case Layout::ModelOpt:
      case Layout::Compressed: {
        const Fp4Matrix q = quantize_nvfp4(w.data(), n, k, global);
        const bool ct = layout == Layout::Compressed;
        tensors[prefix + (ct ? ".weight_packed" : ".weight")] = bytes_tensor(DType::U8, {n, k / 2}, q.packed);
        tensors[prefix + ".weight_scale"] = bytes_tensor(DType::F8_E4M3, {n, k / 16}, q.scales);
        if (ct) {
          add_f32(prefix + ".weight_global_scale", {1}, {1.0f / q.global_scale});
        } else {
          add_f32(prefix + ".weight_scale_2", {}, {q.global_scale});
          add_f32(prefix + ".input_scale", {}, {0.01f});
        }
        break;
      }
      case Layout::Mxfp4:
      case Layout::Mxfp4Compressed: {
        const Fp4Matrix q = quantize_mxfp4(w.data(), n, k);
        const bool ct = layout == Layout::Mxfp4Compressed;
        tensors[prefix + (ct ? ".weight_packed" : ".weight")] = bytes_tensor(DType::U8, {n, k / 2}, q.packed);
        tensors[prefix + ".weight_scale"] = bytes_tensor(ct ? DType::U8 : DType::F8_E8M0, {n, k / 32}, q.scales);
        break;
      }
      case Layout::Bf16: {
        RawTensor t{DType::BF16, {n, k}, std::vector<uint8_t>(size_t(2 * n * k))};
        for (size_t i = 0; i < w.size(); ++i) {
          const uint16_t h = float_to_bf16(w[i]);
          std::memcpy(t.bytes.data() + 2 * i, &h, 2);
        }
        tensors[prefix + ".weight"] = std::move(t);
        break;
      }
    }
  }

  // Writes config.json, the quant config and model.safetensors (or `shards` shards + index).
  void write(const fs::path& dir, int shards = 1) const {
    fs::remove_all(dir);
    fs::create_directories(dir);
    json cfg = config;
    if (layout == Layout::Compressed || layout == Layout::Mxfp4Compressed) cfg["quantization_config"] = quant;
    std::ofstream(dir / "config.json") << cfg.dump(2);
    if (layout == Layout::ModelOpt || layout == Layout::Mxfp4) std::ofstream(dir / "hf_quant_config.json") << quant.dump(2);
    if (shards == 1) {
      SafetensorsWriter w((dir / "model.safetensors").string());
      for (const auto& [name, t] : tensors) w.add(name, t.dtype, t.shape, std::span<const uint8_t>(t.bytes));
      w.finish();
      return;
    }
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    std::vector<std::unique_ptr<SafetensorsWriter>> writers;
    for (int s = 0; s < shards; ++s)
      writers.push_back(std::make_unique<SafetensorsWriter>(
          (dir / fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards)).string()));
    for (const auto& [name, t] : tensors) {
      // Keep each linear's parts together: shard by layer prefix hash.
      const std::string group = name.substr(0, name.rfind('.'));
      const int s = int(std::hash<std::string>{}(group) % size_t(shards));
      writers[size_t(s)]->add(name, t.dtype, t.shape, std::span<const uint8_t>(t.bytes));
      index["weight_map"][name] = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    }
    for (auto& w : writers) w->finish();
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
  }
};

}  // namespace fp4moe::testing_ckpt
