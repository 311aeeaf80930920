// fp4moe make-synthetic OUT_DIR [--preset glm5-tiny|glm5-layer] [--seed N]
//
// A random model in the real checkpoint format of GLM-5-NVFP4 (ModelOpt export):
//   config.json            GlmMoeDsaForCausalLM, GLM-5's field names (routing, MLA, DSA indexer)
//   hf_quant_config.json   ModelOpt, quant_algo NVFP4, exclude_modules (attention, router, lm_head)
//   model.safetensors      (glm5-tiny) or model-0000k-of-0000n.safetensors + index (glm5-layer)
//   sample_input.safetensors  `hidden_states` [16, hidden] BF16 ~ N(0, 1), an input for run-moe
// NVFP4 linear layers (dense MLP, routed and shared experts) are `weight` U8 [N, K/2],
// `weight_scale` F8_E4M3 [N, K/16], `weight_scale_2` F32 [] (gate and up of one expert share
// it: the larger of the two), `input_scale` F32 []; router `mlp.gate.weight` BF16 [E, H],
// `mlp.gate.e_score_correction_bias` F32 [E]; attention, norms and embeddings BF16.
// Weights are approximately normal (Irwin-Hall, 4 terms) with std 1/sqrt(K), quantized with
// quantize_nvfp4. Every tensor has its own random stream, seeded from --seed and its name,
// so the output is deterministic for a seed (and independent of the thread count).
// Tensors are generated and written one at a time (glm5-layer is ~5.5 GB).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "format/fp4.hpp"
#include "format/safetensors.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kSampleTokens = 16;  // tokens of sample_input.safetensors

struct Preset {
  std::string name;
  int64_t hidden, inter_dense, moe_inter, experts, top_k, n_group, topk_group, n_shared;
  int64_t dense_layers, moe_layers;
  int64_t vocab, heads, q_lora, kv_lora, rope_dim, nope_dim, v_dim, index_heads, index_dim, index_topk;
  int64_t max_positions;
  bool attention_and_embeddings;  // glm5-layer leaves them out (see --help)
  bool sharded;                   // one shard per layer + model.safetensors.index.json
};

Preset preset_by_name(const std::string& name) {
  if (name == "glm5-tiny")
    // GLM-5's structure at toy size; grouped routing (n_group 4, topk_group 2) is switched
    // on so the tiny model exercises it (GLM-5 itself has n_group = topk_group = 1).
    return {name, 256, 512, 128, 16, 4, 4, 2, 1, 1, 2,
            1024, 4, 128, 64, 16, 32, 32, 4, 32, 64, 4096, true, false};
  if (name == "glm5-layer")
    // GLM-5's real dimensions (zai-org/GLM-5 config.json); 1 dense + 1 MoE layer.
    return {name, 6144, 12288, 2048, 256, 8, 1, 1, 1, 1, 1,
            154880, 64, 2048, 512, 64, 192, 256, 32, 128, 2048, 202752, false, true};
  FP4MOE_FAIL("unknown preset '{}' (glm5-tiny or glm5-layer)", name);
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t stream_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the tensor name
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t s = h ^ (seed * 0xD1B54A32D192ED03ull);
  return splitmix(s);
}

// values[i] ~ mean + std * N(0,1) (Irwin-Hall of 4 uniforms, unit variance), deterministic
// per (seed, name): filled in pieces of 64 Ki values, each with its own stream.
std::vector<float> random_values(uint64_t seed, const std::string& name, int64_t n, float std_dev, float mean = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t base = stream_seed(seed, name);
  constexpr int64_t kPiece = 1 << 16;
  parallel_for((n + kPiece - 1) / kPiece, default_num_threads(), 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      uint64_t s = base + uint64_t(p) * 0x632BE59BD9B4E019ull;
      const int64_t end = std::min(n, (p + 1) * kPiece);
      for (int64_t i = p * kPiece; i < end; ++i) {
        const uint64_t r = splitmix(s);
        const float u = float((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48)) *
                        (1.0f / 65536.0f);                  // sum of 4 uniforms on [0, 1)
        v[size_t(i)] = mean + std_dev * (u - 2.0f) * 1.7320508f;  // variance 4/12 -> 1
      }
    }
  });
  return v;
}

float abs_max(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Quantizes [rows, cols] with a given global scale, in row slices on all threads (each
// block depends only on its 16 values and the global scale, so slices give identical bytes).
Fp4Matrix quantize_rows_parallel(const std::vector<float>& w, int64_t rows, int64_t cols, float global) {
  Fp4Matrix out;
  out.format = Fp4Format::NVFP4;
  out.rows = rows;
  out.cols = cols;
  out.global_scale = global;
  out.packed.resize(size_t(rows * cols / 2));
  out.scales.resize(size_t(rows * cols / 16));
  parallel_for(rows, default_num_threads(), 64, [&](int64_t r0, int64_t r1) {
    const Fp4Matrix part = quantize_nvfp4(w.data() + r0 * cols, r1 - r0, cols, global);
    std::copy(part.packed.begin(), part.packed.end(), out.packed.begin() + r0 * (cols / 2));
    std::copy(part.scales.begin(), part.scales.end(), out.scales.begin() + r0 * (cols / 16));
  });
  return out;
}

// Writes to the shard of the current layer and records the index.
class ModelWriter {
 public:
  ModelWriter(fs::path dir, uint64_t seed) : dir_(std::move(dir)), seed_(seed) {}

  void open_shard(const std::string& file) {
    close_shard();
    shard_name_ = file;
    writer_ = std::make_unique<SafetensorsWriter>((dir_ / file).string());
    writer_->set_metadata("format", "pt");
    shards_.push_back(file);
  }
  void close_shard() {
    if (writer_) writer_->finish();
    writer_.reset();
  }

  void add(const std::string& name, DType dt, std::vector<int64_t> shape, std::span<const uint8_t> bytes) {
    writer_->add(name, dt, std::move(shape), bytes);
    weight_map_[name] = shard_name_;
    total_bytes_ += bytes.size();
    ++tensors_;
  }
  template <typename T>
  void add(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
    add(name, dt, std::move(shape),
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)));
  }
  void add_f32_scalar(const std::string& name, float v) { add(name, DType::F32, {}, std::vector<float>{v}); }

  // BF16 [rows, cols] (or [rows] when cols == 0) ~ mean + std * N(0, 1).
  void bf16(const std::string& name, int64_t rows, int64_t cols, float std_dev, float mean = 0) {
    const int64_t n = rows * std::max<int64_t>(cols, 1);
    const std::vector<float> v = random_values(seed_, name, n, std_dev, mean);
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
    add(name, DType::BF16, cols ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows}, h);
  }

  void nvfp4_group(const std::string& prefix, const Fp4Matrix& m) {
    add(prefix + ".weight", DType::U8, {m.rows, m.cols / 2}, m.packed);
    add(prefix + ".weight_scale", DType::F8_E4M3, {m.rows, m.cols / 16}, m.scales);
    add_f32_scalar(prefix + ".weight_scale_2", m.global_scale);
    // Nominal activation scale (amax 8 for unit-variance activations): there is no calibration.
    add_f32_scalar(prefix + ".input_scale", nvfp4_global_scale_from_amax(8.0f));
  }
  // One NVFP4 linear layer [n, k], std 1/sqrt(k), its own global scale.
  void nvfp4_linear(const std::string& prefix, int64_t n, int64_t k) {
    const std::vector<float> w = random_values(seed_, prefix, n * k, 1.0f / std::sqrt(float(k)));
    nvfp4_group(prefix, quantize_rows_parallel(w, n, k, nvfp4_global_scale_from_amax(abs_max(w))));
  }
  // gate_proj + up_proj [inter, hidden] sharing weight_scale_2 (the larger), then down_proj.
  void nvfp4_mlp(const std::string& prefix, int64_t hidden, int64_t inter) {
    const float sd = 1.0f / std::sqrt(float(hidden));
    const std::vector<float> gate = random_values(seed_, prefix + ".gate_proj", inter * hidden, sd);
    const std::vector<float> up = random_values(seed_, prefix + ".up_proj", inter * hidden, sd);
    const float g = nvfp4_global_scale_from_amax(std::max(abs_max(gate), abs_max(up)));
    nvfp4_group(prefix + ".gate_proj", quantize_rows_parallel(gate, inter, hidden, g));
    nvfp4_group(prefix + ".up_proj", quantize_rows_parallel(up, inter, hidden, g));
    nvfp4_linear(prefix + ".down_proj", hidden, inter);
  }

  void write_index() const {
    json wm = json::object();
    for (const auto& [name, file] : weight_map_) wm[name] = file;
    json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", wm}};
    write_json(dir_ / "model.safetensors.index.json", index);
  }
  static void write_json(const fs::path& p, const json& j) {
    std::ofstream f(p);
    FP4MOE_CHECK(f.good(), "{}: cannot open for writing", p.string());
    f << j.dump(2) << "\n";
    FP4MOE_CHECK(f.good(), "{}: write failed", p.string());
  }

  uint64_t total_bytes() const { return total_bytes_; }
  int64_t tensors() const { return tensors_; }
  const std::vector<std::string>& shards() const { return shards_; }

 private:
  fs::path dir_;
  uint64_t seed_;
  std::unique_ptr<SafetensorsWriter> writer_;
  std::string shard_name_;
  std::vector<std::string> shards_;
  std::map<std::string, std::string> weight_map_;
  uint64_t total_bytes_ = 0;
  int64_t tensors_ = 0;
};

json exclude_modules() {
  return json::array({"lm_head", "model.embed_tokens", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"});
}

json model_config(const Preset& p) {
  const int64_t layers = p.dense_layers + p.moe_layers;
  json types = json::array();
  for (int64_t l = 0; l < layers; ++l) types.push_back(l < p.dense_layers ? "dense" : "sparse");
  return {
      {"architectures", {"GlmMoeDsaForCausalLM"}},
      {"model_type", "glm_moe_dsa"},
      {"vocab_size", p.vocab},
      {"hidden_size", p.hidden},
      {"intermediate_size", p.inter_dense},
      {"moe_intermediate_size", p.moe_inter},
      {"num_hidden_layers", layers},
      {"first_k_dense_replace", p.dense_layers},
      {"mlp_layer_types", types},
      {"num_attention_heads", p.heads},
      {"num_key_value_heads", p.heads},
      {"n_shared_experts", p.n_shared},
      {"n_routed_experts", p.experts},
      {"num_experts_per_tok", p.top_k},
      {"n_group", p.n_group},
      {"topk_group", p.topk_group},
      {"routed_scaling_factor", 2.5},
      {"norm_topk_prob", true},
      {"scoring_func", "sigmoid"},
      {"topk_method", "noaux_tc"},
      {"kv_lora_rank", p.kv_lora},
      {"q_lora_rank", p.q_lora},
      {"qk_rope_head_dim", p.rope_dim},
      {"qk_nope_head_dim", p.nope_dim},
      {"v_head_dim", p.v_dim},
      {"head_dim", p.rope_dim},
      {"index_topk", p.index_topk},
      {"index_head_dim", p.index_dim},
      {"index_n_heads", p.index_heads},
      {"indexer_rope_interleave", true},
      {"rope_interleave", true},
      {"hidden_act", "silu"},
      {"max_position_embeddings", p.max_positions},
      {"rms_norm_eps", 1e-5},
      {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", false},
      {"num_nextn_predict_layers", 0},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"dtype", "bfloat16"},
      {"quantization_config",
       {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
        {"exclude_modules", exclude_modules()}}},
  };
}

void write_attention(ModelWriter& w, const Preset& p, const std::string& a) {
  const int64_t H = p.hidden;
  const float sd = 1.0f / std::sqrt(float(H));
  w.bf16(a + ".q_a_proj.weight", p.q_lora, H, sd);
  w.bf16(a + ".q_a_layernorm.weight", p.q_lora, 0, 0.02f, 1.0f);
  w.bf16(a + ".q_b_proj.weight", p.heads * (p.nope_dim + p.rope_dim), p.q_lora, 1.0f / std::sqrt(float(p.q_lora)));
  w.bf16(a + ".kv_a_proj_with_mqa.weight", p.kv_lora + p.rope_dim, H, sd);
  w.bf16(a + ".kv_a_layernorm.weight", p.kv_lora, 0, 0.02f, 1.0f);
  w.bf16(a + ".kv_b_proj.weight", p.heads * (p.nope_dim + p.v_dim), p.kv_lora, 1.0f / std::sqrt(float(p.kv_lora)));
  w.bf16(a + ".o_proj.weight", H, p.heads * p.v_dim, 1.0f / std::sqrt(float(p.heads * p.v_dim)));
  w.bf16(a + ".indexer.wq_b.weight", p.index_heads * p.index_dim, p.q_lora, 1.0f / std::sqrt(float(p.q_lora)));
  w.bf16(a + ".indexer.wk.weight", p.index_dim, H, sd);
  w.bf16(a + ".indexer.k_norm.weight", p.index_dim, 0, 0.02f, 1.0f);
  w.bf16(a + ".indexer.k_norm.bias", p.index_dim, 0, 0.02f);
  w.bf16(a + ".indexer.weights_proj.weight", p.index_heads, H, sd);
}

int make_synthetic(const std::string& out_dir, const std::string& preset_name, uint64_t seed) {
  const Preset p = preset_by_name(preset_name);
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir(out_dir);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    FP4MOE_CHECK(fs::is_directory(dir, ec), "{}: exists and is not a directory", out_dir);
  } else {
    fs::create_directories(dir, ec);
    FP4MOE_CHECK(!ec, "{}: cannot create the directory: {}", out_dir, ec.message());
  }
  // A stale index from an earlier run of the other preset would shadow model.safetensors.
  for (const char* stale : {"model.safetensors.index.json", "model.safetensors"}) fs::remove(dir / stale, ec);

  ModelWriter w(dir, seed);
  const int64_t layers = p.dense_layers + p.moe_layers, H = p.hidden;
  auto shard = [&](int64_t k) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, layers); };
  if (!p.sharded) w.open_shard("model.safetensors");
  if (p.attention_and_embeddings) w.bf16("model.embed_tokens.weight", p.vocab, H, 1.0f);
  for (int64_t l = 0; l < layers; ++l) {
    if (p.sharded) w.open_shard(shard(l));
    const std::string L = fmt::format("model.layers.{}", l);
    w.bf16(L + ".input_layernorm.weight", H, 0, 0.02f, 1.0f);
    w.bf16(L + ".post_attention_layernorm.weight", H, 0, 0.02f, 1.0f);
    if (p.attention_and_embeddings) write_attention(w, p, L + ".self_attn");
    if (l < p.dense_layers) {
      w.nvfp4_mlp(L + ".mlp", H, p.inter_dense);
      continue;
    }
    w.bf16(L + ".mlp.gate.weight", p.experts, H, 1.0f / std::sqrt(float(H)));
    w.add(L + ".mlp.gate.e_score_correction_bias", DType::F32, {p.experts},
          random_values(seed, L + ".mlp.gate.e_score_correction_bias", p.experts, 0.05f));
    for (int64_t e = 0; e < p.experts; ++e) {
      w.nvfp4_mlp(fmt::format("{}.mlp.experts.{}", L, e), H, p.moe_inter);
      if (p.experts >= 64 && (e + 1) % 32 == 0)
        fmt::print(stderr, "make-synthetic: layer {}: {} of {} experts written\n", l, e + 1, p.experts);
    }
    w.nvfp4_mlp(L + ".mlp.shared_experts", H, p.n_shared * p.moe_inter);
  }
  if (p.attention_and_embeddings) {
    w.bf16("model.norm.weight", H, 0, 0.02f, 1.0f);
    w.bf16("lm_head.weight", p.vocab, H, 1.0f / std::sqrt(float(H)));
  }
  w.close_shard();
  if (p.sharded) w.write_index();

  {
    SafetensorsWriter in((dir / "sample_input.safetensors").string());
    const std::vector<float> x = random_values(seed, "sample_input.hidden_states", kSampleTokens * H, 1.0f);
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = float_to_bf16(x[i]);
    in.add("hidden_states", DType::BF16, {kSampleTokens, H}, h);
    in.finish();
  }
  ModelWriter::write_json(dir / "config.json", model_config(p));
  ModelWriter::write_json(dir / "hf_quant_config.json",
                          {{"producer", {{"name", "modelopt"}, {"version", "0.47.0"}}},
                           {"quantization",
                            {{"quant_algo", "NVFP4"},
                             {"kv_cache_quant_algo", nullptr},
                             {"group_size", 16},
                             {"exclude_modules", exclude_modules()}}}});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{}: {} (GlmMoeDsaForCausalLM, {} layers: {} dense + {} MoE, H={} E={} top-{} I={}), "
             "{} tensors, {:.1f} MB in {} file(s), seed {}, {:.1f} s\n",
             out_dir, p.name, layers, p.dense_layers, p.moe_layers, H, p.experts, p.top_k, p.moe_inter,
             w.tensors(), double(w.total_bytes()) / 1e6, w.shards().size(), seed, s);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto out = std::make_shared<std::string>();
  auto preset = std::make_shared<std::string>("glm5-tiny");
  auto seed = std::make_shared<uint64_t>(0);
  app.add_option("OUT_DIR", *out, "output folder (created if missing; files of the same names are replaced)")
      ->required();
  app.add_option("--preset", *preset,
                 "glm5-tiny: GLM-5's architecture at toy size (H=256, 16 experts, top-4, grouped routing), "
                 "every tensor incl. MLA/indexer attention, norms, embeddings, lm_head, one file (~3 MB). "
                 "glm5-layer: GLM-5's real MoE dims (H=6144, I=2048, E=256, top-8, n_group=topk_group=1, "
                 "1 shared expert), 1 dense + 1 MoE layer, one shard per layer + index (~5.6 GB); it OMITS "
                 "the attention, embedding and lm_head weights (the config still describes them)")
      ->check(CLI::IsMember({"glm5-tiny", "glm5-layer"}));
  app.footer("Also writes OUT_DIR/sample_input.safetensors (`hidden_states` [16, hidden] BF16) for run-moe.");
  app.add_option("--seed", *seed, "random seed (default 0); the output is deterministic for a seed");
  run = [out, preset, seed] { return make_synthetic(*out, *preset, *seed); };
}

const cli::Registrar reg{"make-synthetic", "Write a random GLM-5-architecture NVFP4 checkpoint (ModelOpt layout)",
                         setup};

}  // namespace
}  // namespace fp4moe
