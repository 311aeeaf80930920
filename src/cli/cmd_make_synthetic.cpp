// fp4moe make-synthetic OUT_DIR [--preset P] [--seed N] [--layers N] [--dense-layers N]
//                       [--mtp-layers N] [--heads N] [--list | --config-only]
//
// A complete random model in the real checkpoint format of NVIDIA's GLM-5-NVFP4 / DeepSeek-V3
// NVFP4 checkpoints (ModelOpt export), every tensor transformers' GlmMoeDsaForCausalLM /
// DeepseekV3ForCausalLM has plus the MTP layer(s) (synthetic_model.hpp lists the layout):
//   config.json            transformers 5.x field names, quantization_config (ModelOpt NVFP4 W4A4)
//   hf_quant_config.json   ModelOpt, quant_algo NVFP4, exclude_modules (NVIDIA's globs)
//   model.safetensors      (tiny presets) or model-0000k-of-0000n.safetensors + index (glm5-layer:
//                          embeddings, one shard per layer, MTP layers, norm + lm_head)
//   sample_input.safetensors  `hidden_states` [16, hidden] BF16 ~ N(0, 1), an input for run-moe
// Weights are approximately normal (Irwin-Hall, 4 terms) with std 1/sqrt(K) (embeddings 1,
// norms 1 ± 0.02); routed experts are quantized with quantize_nvfp4, gate and up of an expert
// sharing weight_scale_2 (the larger), with a nominal input_scale (amax 8: no calibration).
// Every tensor has its own random stream, seeded from --seed and its name, so the output is
// deterministic for a seed (and independent of the thread count). Tensors are generated and
// written in pieces (glm5-layer's embeddings alone are 1.9 GB), so memory stays near one expert.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/modelopt_config.hpp"
#include "cli/synthetic_model.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/threads.hpp"
#include "format/fp4.hpp"
#include "format/safetensors.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using cli::SyntheticSpec;
using cli::SyntheticTensor;

constexpr int64_t kSampleTokens = 16;   // tokens of sample_input.safetensors
constexpr int64_t kPiece = 1 << 16;     // values per random stream
constexpr int64_t kChunk = 256 * kPiece;  // values generated and written at a time (16 Mi)

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

// out[i - begin] = value i of the tensor's stream, i in [begin, end), begin a multiple of
// kPiece: mean + std * N(0,1) (Irwin-Hall of 4 uniforms, unit variance). Value i depends only
// on (seed, name, i): each piece of kPiece values has its own stream.
void random_fill(uint64_t seed, const std::string& name, int64_t begin, int64_t end, float std_dev, float mean,
                 float* out) {
  const uint64_t base = stream_seed(seed, name);
  const int64_t p0 = begin / kPiece, p1 = (end + kPiece - 1) / kPiece;
  parallel_for(p1 - p0, default_num_threads(), 1, [&](int64_t b, int64_t e) {
    for (int64_t p = p0 + b; p < p0 + e; ++p) {
      uint64_t s = base + uint64_t(p) * 0x632BE59BD9B4E019ull;
      const int64_t stop = std::min(end, (p + 1) * kPiece);
      for (int64_t i = p * kPiece; i < stop; ++i) {
        const uint64_t r = splitmix(s);
        const float u = float((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48)) *
                        (1.0f / 65536.0f);                          // sum of 4 uniforms on [0, 1)
        out[i - begin] = mean + std_dev * (u - 2.0f) * 1.7320508f;  // variance 4/12 -> 1
      }
    }
  });
}

std::vector<float> random_values(uint64_t seed, const std::string& name, int64_t n, float std_dev, float mean = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  random_fill(seed, name, 0, n, std_dev, mean, v.data());
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

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream f(p);
  FP4MOE_CHECK(f.good(), "{}: cannot open for writing", p.string());
  f << j.dump(2) << "\n";
  FP4MOE_CHECK(f.good(), "{}: write failed", p.string());
}

// Writes the planned entries of one shard.
class ShardWriter {
 public:
  ShardWriter(const fs::path& path, uint64_t seed) : w_(path.string()), seed_(seed) { w_.set_metadata("format", "pt"); }

  void write(const SyntheticTensor& t) {
    using Kind = SyntheticTensor::Kind;
    switch (t.kind) {
      case Kind::Bf16: return bf16(t);
      case Kind::F32: return add(t.name, DType::F32, {t.rows}, as_bytes(random_values(seed_, t.name, t.rows, t.std_dev)));
      case Kind::Nvfp4Linear: {
        const std::vector<float> v = random_values(seed_, t.name, t.rows * t.cols, t.std_dev);
        return nvfp4(t.name, quantize_rows_parallel(v, t.rows, t.cols, nvfp4_global_scale_from_amax(abs_max(v))));
      }
      case Kind::Nvfp4GateUp: {
        const std::vector<float> gate = random_values(seed_, t.name + ".gate_proj", t.rows * t.cols, t.std_dev);
        const std::vector<float> up = random_values(seed_, t.name + ".up_proj", t.rows * t.cols, t.std_dev);
        const float g = nvfp4_global_scale_from_amax(std::max(abs_max(gate), abs_max(up)));
        nvfp4(t.name + ".gate_proj", quantize_rows_parallel(gate, t.rows, t.cols, g));
        return nvfp4(t.name + ".up_proj", quantize_rows_parallel(up, t.rows, t.cols, g));
      }
    }
  }
  void finish() { w_.finish(); }
  uint64_t bytes() const { return bytes_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  void add(const std::string& name, DType dt, std::vector<int64_t> shape, std::span<const uint8_t> data) {
    w_.add(name, dt, std::move(shape), data);
    names_.push_back(name);
    bytes_ += data.size();
  }
  // BF16 [rows, cols] (or [rows]) in chunks: generated, rounded and appended piece by piece.
  void bf16(const SyntheticTensor& t) {
    const int64_t n = t.rows * std::max<int64_t>(t.cols, 1);
    w_.begin_tensor(t.name, DType::BF16, t.cols ? std::vector<int64_t>{t.rows, t.cols} : std::vector<int64_t>{t.rows});
    std::vector<float> v(size_t(std::min(n, kChunk)));
    std::vector<uint16_t> h(v.size());
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t e = std::min(n, b + kChunk);
      random_fill(seed_, t.name, b, e, t.std_dev, t.mean, v.data());
      for (int64_t i = 0; i < e - b; ++i) h[size_t(i)] = float_to_bf16(v[size_t(i)]);
      w_.append({reinterpret_cast<const uint8_t*>(h.data()), size_t(e - b) * 2});
    }
    w_.end_tensor();
    names_.push_back(t.name);
    bytes_ += uint64_t(n) * 2;
  }
  void nvfp4(const std::string& m, const Fp4Matrix& q) {
    add(m + ".weight", DType::U8, {q.rows, q.cols / 2}, as_bytes(q.packed));
    add(m + ".weight_scale", DType::F8_E4M3, {q.rows, q.cols / 16}, as_bytes(q.scales));
    add(m + ".weight_scale_2", DType::F32, {}, as_bytes(std::vector<float>{q.global_scale}));
    // Nominal activation scale (amax 8 for unit-variance activations): there is no calibration.
    add(m + ".input_scale", DType::F32, {}, as_bytes(std::vector<float>{nvfp4_global_scale_from_amax(8.0f)}));
  }

  SafetensorsWriter w_;
  uint64_t seed_;
  uint64_t bytes_ = 0;
  std::vector<std::string> names_;
};

void prepare_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    FP4MOE_CHECK(fs::is_directory(dir, ec), "{}: exists and is not a directory", dir.string());
  } else {
    fs::create_directories(dir, ec);
    FP4MOE_CHECK(!ec, "{}: cannot create the directory: {}", dir.string(), ec.message());
  }
  // Weights of an earlier run (another preset or layer count) would be loaded with this one.
  static const std::regex kOurs(R"(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json)");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), kOurs)) fs::remove(e.path(), ec);
}

void write_configs(const fs::path& dir, const SyntheticSpec& s) {
  const cli::ModelOptQuant q{"NVFP4", 16, true, cli::synthetic_exclude_modules(s),
                             {{"name", "modelopt"}, {"version", "0.47.0"}}};
  json config = cli::synthetic_config(s);
  config["quantization_config"] = cli::modelopt_quantization_config(q);
  write_json(dir / "config.json", config);
  write_json(dir / "hf_quant_config.json", cli::modelopt_hf_quant_config(q));
}

int list_plan(const SyntheticSpec& s) {
  for (const cli::SyntheticShard& sh : cli::synthetic_plan(s))
    for (const SyntheticTensor& t : sh.tensors)
      for (const cli::WrittenTensor& w : cli::written_tensors(t))
        fmt::print("{} {} [{}] {}\n", w.name, dtype_name(w.dtype), fmt::join(w.shape, ","), sh.file);
  return 0;
}

int make_synthetic(const std::string& out_dir, const SyntheticSpec& s, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir(out_dir);
  prepare_dir(dir);

  const std::vector<cli::SyntheticShard> plan = cli::synthetic_plan(s);
  json weight_map = json::object();
  uint64_t total = 0;
  int64_t tensors = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    ShardWriter w(dir / plan[k].file, seed);
    for (const SyntheticTensor& t : plan[k].tensors) w.write(t);
    w.finish();
    for (const std::string& n : w.names()) weight_map[n] = plan[k].file;
    total += w.bytes();
    tensors += int64_t(w.names().size());
    if (plan.size() > 1)
      fmt::print(stderr, "make-synthetic: {} of {} shards written ({:.1f} GB)\n", k + 1, plan.size(), double(total) / 1e9);
  }
  if (s.sharded)
    write_json(dir / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});

  {
    SafetensorsWriter in((dir / "sample_input.safetensors").string());
    const std::vector<float> x = random_values(seed, "sample_input.hidden_states", kSampleTokens * s.hidden, 1.0f);
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = float_to_bf16(x[i]);
    in.add("hidden_states", DType::BF16, {kSampleTokens, s.hidden}, h);
    in.finish();
  }
  write_configs(dir, s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{}: {} ({}, {} layers: {} dense + {} MoE, + {} MTP; H={} E={} top-{} I={}), "
             "{} tensors, {:.1f} MB in {} file(s), seed {}, {:.1f} s\n",
             out_dir, s.preset, s.architecture, s.layers, s.dense_layers, s.layers - s.dense_layers, s.mtp_layers,
             s.hidden, s.experts, s.top_k, s.moe_inter, tensors, double(total) / 1e6, plan.size(), seed, secs);
  return 0;
}

struct Options {
  std::string out, preset = "glm5-tiny";
  uint64_t seed = 0;
  std::optional<int64_t> layers, dense_layers, mtp_layers, heads;
  bool list = false, config_only = false;
};

void setup(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<Options>();
  app.add_option("OUT_DIR", o->out, "output folder (created if missing; files of the same names are replaced)")
      ->required();
  app.add_option("--preset", o->preset,
                 "glm5-tiny: GLM-5's architecture at toy size (H=256, vocab 1024, 16 experts top-4, grouped "
                 "routing, 16 indexer heads, index_topk 32; 1 dense + 2 MoE layers + 1 MTP layer; ~10 MB). "
                 "glm5-tiny-shared: the same with 4 layers whose indexer_types are full/shared/full/shared. "
                 "deepseek-v3-tiny: DeepseekV3ForCausalLM at the same size, q_lora_rank null, YaRN rope, no "
                 "indexer. glm5-attn-tiny: glm5-tiny with GLM-5's attention dims (64 heads, kv_lora 512, rope 64, nope "
                 "192, v 256, q_lora 256, indexer 32 x 128, index_topk 64), 1 dense + 1 MoE layer, no MTP (~110 MB): "
                 "the GPU runner's fast attention path at toy size (DSA top-k rows). deepseek-v3-attn-tiny: deepseek-v3-tiny "
                 "with DeepSeek-V3's attention dims (128 heads, kv_lora 512, rope 64, nope 128, v 128), 1 dense + 1 MoE "
                 "layer: the fast path's dense decode. glm5-layer: GLM-5's real dimensions (H=6144, vocab 154880, E=256 top-8, I=2048, "
                 "MLA + DSA indexer), 1 dense + 1 MoE layer, no MTP layer by default (~10 GB; each extra MoE "
                 "layer ~5.8 GB, a dense one ~0.8 GB, an MTP layer ~19.7 GB: its experts are BF16); one shard "
                 "per layer + index")
      ->check(CLI::IsMember(cli::synthetic_preset_names()))
      ->capture_default_str();
  app.add_option("--seed", o->seed, "random seed (default 0); the output is deterministic for a seed");
  app.add_option("--layers", o->layers, "decoder layers (num_hidden_layers), overriding the preset")
      ->check(CLI::PositiveNumber);
  app.add_option("--dense-layers", o->dense_layers, "leading dense-MLP layers (first_k_dense_replace)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mtp-layers", o->mtp_layers, "MTP layers after the decoder layers (num_nextn_predict_layers)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--heads", o->heads, "attention heads (num_attention_heads), overriding the preset")
      ->check(CLI::Range(int64_t(1), int64_t(256)));
  app.add_flag("--list", o->list, "print every tensor (name dtype [shape] file) and write nothing (OUT_DIR untouched)");
  app.add_flag("--config-only", o->config_only, "write config.json and hf_quant_config.json only (no weights)");
  app.footer("Also writes OUT_DIR/sample_input.safetensors (`hidden_states` [16, hidden] BF16) for run-moe. "
             "tools/oracle/check_synthetic.py loads the tiny presets with transformers.");
  run = [o] {
    SyntheticSpec s = cli::synthetic_preset(o->preset, o->layers, o->dense_layers, o->mtp_layers);
    if (o->heads) s.heads = *o->heads;
    if (o->list) return list_plan(s);
    if (o->config_only) {
      prepare_dir(o->out);
      write_configs(o->out, s);
      return 0;
    }
    return make_synthetic(o->out, s, o->seed);
  };
}

const cli::Registrar reg{"make-synthetic", "Write a complete random GLM-5 / DeepSeek-V3 NVFP4 checkpoint (ModelOpt layout)",
                         setup};

}  // namespace
}  // namespace fp4moe
