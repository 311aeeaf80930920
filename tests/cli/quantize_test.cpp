// `fp4moe quantize` end to end: a small random sharded BF16/F16/F32 checkpoint written with
// SafetensorsWriter, quantized by the real binary, reopened and checked tensor by tensor.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "format/checkpoint.hpp"
#include "format/codecs.hpp"
#include "format/fp4.hpp"
#include "format/safetensors.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kBinary = std::string(FP4MOE_BINARY_DIR) + "/bin/fp4moe";
constexpr int64_t kHidden = 64, kInter = 32, kExperts = 4, kVocab = 48, kKvDim = 32;

struct RunResult {
  int rc;
  std::string err, out;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

RunResult run_cli(const std::string& args, const fs::path& tmp) {
  const fs::path err = tmp / "stderr.txt", out = tmp / "stdout.txt";
  const std::string cmd = "'" + kBinary + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(err), slurp(out)};
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// One source tensor as float (what the quantizer sees) plus its stored bytes.
struct Src {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;  // exactly representable in dtype
  std::vector<uint8_t> bytes;
};

// float -> IEEE half for values that are exact in half (normal range, <= 11 significant bits).
uint16_t float_to_half_exact(float f) {
  if (f == 0.0f) return std::signbit(f) ? 0x8000 : 0;
  int e;
  const float m = std::frexp(std::fabs(f), &e);  // |f| = m * 2^e, m in [0.5, 1)
  const uint16_t man = uint16_t(std::lround((m * 2.0f - 1.0f) * 1024.0f));
  return uint16_t((f < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | man);
}

Src make_tensor(const std::string& name, DType dt, std::vector<int64_t> shape, std::mt19937& rng, float scale) {
  Src s{name, dt, shape, {}, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::normal_distribution<float> nd(0.0f, scale);
  s.values.resize(size_t(n));
  for (auto& v : s.values) {
    v = nd(rng);
    if (dt == DType::BF16) v = round_to_bf16(v);
    if (dt == DType::F16) v = std::fabs(v) < 1e-4f ? 0.0f : round_to_bf16(v);  // 8 bits, normal: exact in F16
  }
  if (dt == DType::BF16) {
    for (float v : s.values) {
      const uint16_t h = float_to_bf16(v);
      s.bytes.push_back(uint8_t(h & 0xFF));
      s.bytes.push_back(uint8_t(h >> 8));
    }
  } else if (dt == DType::F16) {
    for (float v : s.values) {
      const uint16_t h = float_to_half_exact(v);
      s.bytes.push_back(uint8_t(h & 0xFF));
      s.bytes.push_back(uint8_t(h >> 8));
    }
  } else {
    s.bytes.resize(s.values.size() * 4);
    std::memcpy(s.bytes.data(), s.values.data(), s.bytes.size());
  }
  return s;
}

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is not built";
    tmp_ = fs::temp_directory_path() / ("fp4moe_quantize_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
    in_ = tmp_ / "in";
    fs::create_directories(in_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // A Qwen3-MoE-shaped checkpoint in two shards; expert 2's gate and up live in different
  // shards, expert 3 is F16, q_proj is F32, up_proj amaxes are ~3x the gate's.
  void write_checkpoint(bool poison_nan = false) {
    std::mt19937 rng(1234);
    const std::string L = "model.layers.0.";
    std::vector<Src> s1, s2;
    s1.push_back(make_tensor("model.embed_tokens.weight", DType::BF16, {kVocab, kHidden}, rng, 1.0f));
    s1.push_back(make_tensor(L + "input_layernorm.weight", DType::BF16, {kHidden}, rng, 1.0f));
    s1.push_back(make_tensor(L + "self_attn.q_proj.weight", DType::F32, {kHidden, kHidden}, rng, 0.05f));
    s1.push_back(make_tensor(L + "self_attn.q_proj.bias", DType::BF16, {kHidden}, rng, 0.1f));
    s1.push_back(make_tensor(L + "self_attn.k_proj.weight", DType::BF16, {kKvDim, kHidden}, rng, 0.2f));
    s1.push_back(make_tensor(L + "self_attn.v_proj.weight", DType::BF16, {kKvDim, kHidden}, rng, 0.1f));
    s1.push_back(make_tensor(L + "self_attn.o_proj.weight", DType::BF16, {kHidden, kHidden}, rng, 0.05f));
    s1.push_back(make_tensor(L + "mlp.gate.weight", DType::BF16, {kExperts, kHidden}, rng, 0.1f));
    for (int e = 0; e < kExperts; ++e) {
      const std::string p = L + "mlp.experts." + std::to_string(e) + ".";
      const DType dt = e == 3 ? DType::F16 : DType::BF16;
      auto& gate_shard = e < 3 ? s1 : s2;
      auto& rest_shard = e < 2 ? s1 : s2;
      gate_shard.push_back(make_tensor(p + "gate_proj.weight", dt, {kInter, kHidden}, rng, 0.02f));
      rest_shard.push_back(make_tensor(p + "up_proj.weight", dt, {kInter, kHidden}, rng, 0.06f));
      rest_shard.push_back(make_tensor(p + "down_proj.weight", dt, {kHidden, kInter}, rng, 0.03f));
    }
    s2.push_back(make_tensor("model.norm.weight", DType::BF16, {kHidden}, rng, 1.0f));
    s2.push_back(make_tensor("lm_head.weight", DType::BF16, {kVocab, kHidden}, rng, 0.05f));
    if (poison_nan) {
      for (auto& t : s1)
        if (t.name == L + "self_attn.q_proj.weight") {
          const float nan = NAN;
          std::memcpy(t.bytes.data() + 4 * 77, &nan, 4);
        }
    }

    json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
    const std::string names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 2; ++i) {
      SafetensorsWriter w((in_ / names[i]).string());
      w.set_metadata("format", "pt");
      for (const Src& t : (i == 0 ? s1 : s2)) {
        w.add(t.name, t.dtype, t.shape, t.bytes);
        index["weight_map"][t.name] = names[i];
        src_[t.name] = t;
      }
      w.finish();
    }
    std::ofstream(in_ / "model.safetensors.index.json") << index.dump(1);
    const json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                         {"model_type", "qwen3_moe"},
                         {"hidden_size", kHidden},
                         {"num_hidden_layers", 1},
                         {"vocab_size", kVocab},
                         {"intermediate_size", 128},
                         {"num_attention_heads", 4},
                         {"num_key_value_heads", 2},
                         {"head_dim", 16},
                         {"moe_intermediate_size", kInter},
                         {"num_experts", kExperts},
                         {"num_experts_per_tok", 2},
                         {"norm_topk_prob", true},
                         {"torch_dtype", "bfloat16"}};
    std::ofstream(in_ / "config.json") << config.dump(1);
    std::ofstream(in_ / "tokenizer.json") << "{\"fake\": true}\n";
  }

  // All output tensors by name, from the index.
  void open_output(const fs::path& out) {
    const json index = json::parse(slurp(out / "model.safetensors.index.json"));
    files_.clear();
    out_.clear();
    std::map<std::string, size_t> file_id;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      const std::string shard = it.value();
      if (!file_id.count(shard)) {
        file_id[shard] = files_.size();
        files_.push_back(SafetensorsFile::open((out / shard).string()));
      }
      const SafetensorsFile* f = files_[file_id[shard]].get();
      const TensorInfo* t = f->find(it.key());
      ASSERT_NE(t, nullptr) << it.key();
      out_[it.key()] = {f, t};
    }
  }
  const TensorInfo& info(const std::string& name) {
    EXPECT_TRUE(out_.count(name)) << "missing " << name;
    return *out_.at(name).second;
  }
  std::span<const uint8_t> bytes(const std::string& name) { return out_.at(name).first->bytes(info(name)); }
  float scalar_f32(const std::string& name) {
    float v;
    std::memcpy(&v, bytes(name).data(), 4);
    return v;
  }
  static float amax(const Src& s) {
    float m = 0;
    for (float v : s.values) m = std::max(m, std::fabs(v));
    return m;
  }

  fs::path tmp_, in_;
  std::map<std::string, Src> src_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> out_;
};

const std::vector<std::string> kUnchanged = {
    "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias",
    "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate.weight", "model.norm.weight",
    "lm_head.weight"};

std::vector<std::string> quantized_modules() {
  std::vector<std::string> m = {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                                "model.layers.0.self_attn.v_proj"};
  for (int e = 0; e < kExperts; ++e)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"})
      m.push_back("model.layers.0.mlp.experts." + std::to_string(e) + "." + p);
  return m;
}

TEST_F(QuantizeCli, Nvfp4LayoutSharedScalesAndUnchangedTensors) {
  write_checkpoint();
  const fs::path out = tmp_ / "out";
  const RunResult r = run_cli("quantize '" + in_.string() + "' '" + out.string() + "' --exclude '*.o_proj' --threads 2", tmp_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("quantized 15 linear weights"), std::string::npos) << r.out;
  open_output(out);

  // Every input tensor is there; quantized ones have exactly three parts.
  EXPECT_EQ(out_.size(), src_.size() + 2 * quantized_modules().size());
  for (const std::string& name : kUnchanged) {
    SCOPED_TRACE(name);
    const Src& s = src_.at(name);
    EXPECT_EQ(info(name).dtype, s.dtype);
    EXPECT_EQ(info(name).shape, s.shape);
    ASSERT_EQ(bytes(name).size(), s.bytes.size());
    EXPECT_EQ(std::memcmp(bytes(name).data(), s.bytes.data(), s.bytes.size()), 0);
  }

  for (const std::string& m : quantized_modules()) {
    SCOPED_TRACE(m);
    const Src& s = src_.at(m + ".weight");
    const int64_t n = s.shape[0], k = s.shape[1];
    EXPECT_EQ(info(m + ".weight").dtype, DType::U8);
    EXPECT_EQ(info(m + ".weight").shape, (std::vector<int64_t>{n, k / 2}));
    EXPECT_EQ(info(m + ".weight_scale").dtype, DType::F8_E4M3);
    EXPECT_EQ(info(m + ".weight_scale").shape, (std::vector<int64_t>{n, k / 16}));
    EXPECT_EQ(info(m + ".weight_scale_2").dtype, DType::F32);
    EXPECT_TRUE(info(m + ".weight_scale_2").shape.empty());
    EXPECT_FALSE(out_.count(m + ".input_scale"));

    // The global scale: shared by gate/up (and q/k/v) from the larger amax; down its own.
    float want_amax = amax(s);
    const std::string leaf = m.substr(m.rfind('.') + 1), parent = m.substr(0, m.rfind('.'));
    if (leaf == "gate_proj" || leaf == "up_proj")
      want_amax = std::max(amax(src_.at(parent + ".gate_proj.weight")), amax(src_.at(parent + ".up_proj.weight")));
    if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj")
      for (const char* p : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight"})
        want_amax = std::max(want_amax, amax(src_.at(parent + p)));
    const float gs = scalar_f32(m + ".weight_scale_2");
    EXPECT_EQ(gs, nvfp4_global_scale_from_amax(want_amax));

    // Bytes equal the library's quantizer (itself bit-exact with ModelOpt) at that scale.
    const Fp4Matrix q = quantize_nvfp4(s.values.data(), n, k, gs);
    ASSERT_EQ(bytes(m + ".weight").size(), q.packed.size());
    EXPECT_EQ(std::memcmp(bytes(m + ".weight").data(), q.packed.data(), q.packed.size()), 0);
    EXPECT_EQ(std::memcmp(bytes(m + ".weight_scale").data(), q.scales.data(), q.scales.size()), 0);

    // And they decode close to the source.
    const Fp4MatrixView v{Fp4Format::NVFP4, n, k, bytes(m + ".weight").data(), bytes(m + ".weight_scale").data(), gs};
    std::vector<float> deq(size_t(n * k), NAN);
    dequantize_rows(v, 0, n, deq.data());
    double num = 0, den = 0;
    for (size_t i = 0; i < deq.size(); ++i) {
      num += (deq[i] - s.values[i]) * double(deq[i] - s.values[i]);
      den += double(s.values[i]) * s.values[i];
    }
    EXPECT_LT(std::sqrt(num / den), leaf == "gate_proj" ? 0.2 : 0.11);  // gate uses up's larger scale
  }
  for (int e = 0; e < kExperts; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e);
    EXPECT_EQ(scalar_f32(p + ".gate_proj.weight_scale_2"), scalar_f32(p + ".up_proj.weight_scale_2"));
    EXPECT_GT(amax(src_.at(p + ".up_proj.weight")), 1.5f * amax(src_.at(p + ".gate_proj.weight")));
  }

  // Configs.
  const json cfg = json::parse(slurp(out / "config.json"));
  const json hq = json::parse(slurp(out / "hf_quant_config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "modelopt");
  EXPECT_EQ(cfg["quantization_config"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(cfg["hidden_size"], kHidden);
  EXPECT_EQ(hq["quantization"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(hq["quantization"]["group_size"], 16);
  const auto excl = hq["quantization"]["exclude_modules"].get<std::vector<std::string>>();
  for (const char* want : {"lm_head", "model.layers.0.mlp.gate", "*.o_proj", "model.layers.0.self_attn.o_proj"})
    EXPECT_NE(std::find(excl.begin(), excl.end(), want), excl.end()) << want;
  EXPECT_EQ(slurp(out / "tokenizer.json"), "{\"fake\": true}\n");

  // The engine's reader recognises the result.
  const auto ck = Checkpoint::open(out.string());
  EXPECT_EQ(ck->quant().quant_algo, "W4A16_NVFP4");
  EXPECT_TRUE(ck->quant().is_ignored("lm_head"));
  EXPECT_FALSE(ck->quant().is_ignored("model.layers.0.mlp.experts.0.gate_proj"));
  int nvfp4_groups = 0;
  for (const TensorGroup& g : ck->groups()) nvfp4_groups += g.format == TensorGroupFormat::ModelOptNVFP4;
  EXPECT_EQ(nvfp4_groups, int(quantized_modules().size()));
}

TEST_F(QuantizeCli, Mxfp4Layout) {
  write_checkpoint();
  const fs::path out = tmp_ / "out_mx";
  const RunResult r = run_cli("quantize '" + in_.string() + "' '" + out.string() + "' --format mxfp4", tmp_);
  ASSERT_EQ(r.rc, 0) << r.err;
  open_output(out);
  for (const std::string& m : quantized_modules()) {
    SCOPED_TRACE(m);
    const Src& s = src_.at(m + ".weight");
    const int64_t n = s.shape[0], k = s.shape[1];
    EXPECT_EQ(info(m + ".weight_scale").dtype, DType::U8);
    EXPECT_EQ(info(m + ".weight_scale").shape, (std::vector<int64_t>{n, k / 32}));
    EXPECT_FALSE(out_.count(m + ".weight_scale_2"));
    const Fp4Matrix q = quantize_mxfp4(s.values.data(), n, k);
    EXPECT_EQ(std::memcmp(bytes(m + ".weight").data(), q.packed.data(), q.packed.size()), 0);
    EXPECT_EQ(std::memcmp(bytes(m + ".weight_scale").data(), q.scales.data(), q.scales.size()), 0);
  }
  // o_proj is quantized here (no --exclude).
  EXPECT_EQ(info("model.layers.0.self_attn.o_proj.weight").dtype, DType::U8);
  const json hq = json::parse(slurp(out / "hf_quant_config.json"));
  EXPECT_EQ(hq["quantization"]["quant_algo"], "W4A16_MXFP4");
  EXPECT_EQ(hq["quantization"]["group_size"], 32);
}

TEST_F(QuantizeCli, OnlyRoutedExpertsWithInputScaleIsNvidiasLayout) {
  write_checkpoint();
  const fs::path out = tmp_ / "out";
  const RunResult r =
      run_cli("quantize '" + in_.string() + "' '" + out.string() + "' --only '*.mlp.experts.*' --input-amax 8", tmp_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("quantized 12 linear weights"), std::string::npos) << r.out;
  open_output(out);
  for (const std::string& m : quantized_modules()) {
    SCOPED_TRACE(m);
    if (m.find(".mlp.experts.") == std::string::npos) {  // attention stays as it was
      EXPECT_EQ(info(m + ".weight").dtype, src_.at(m + ".weight").dtype);
      EXPECT_FALSE(out_.count(m + ".weight_scale"));
      continue;
    }
    EXPECT_EQ(info(m + ".weight").dtype, DType::U8);
    ASSERT_TRUE(out_.count(m + ".input_scale"));
    EXPECT_EQ(info(m + ".input_scale").dtype, DType::F32);
    EXPECT_TRUE(info(m + ".input_scale").shape.empty());
    EXPECT_EQ(scalar_f32(m + ".input_scale"), nvfp4_global_scale_from_amax(8.0f));
  }
  const json cfg = json::parse(slurp(out / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_algo"], "NVFP4");
  EXPECT_TRUE(cfg["quantization_config"]["config_groups"]["group_0"].contains("input_activations"));
  const auto ck = Checkpoint::open(out.string());
  EXPECT_EQ(ck->quant().quant_algo, "NVFP4");
  EXPECT_TRUE(ck->quant().activation_quant);
  EXPECT_TRUE(ck->quant().is_ignored("model.layers.0.self_attn.q_proj"));
  const MoeLayerWeights w = ck->load_moe_layer(0);
  EXPECT_EQ(w.w13.format, WeightFormat::NVFP4);

  // Nothing matched, and --input-amax with MXFP4: one line each.
  RunResult bad = run_cli("quantize '" + in_.string() + "' '" + (tmp_ / "o2").string() + "' --only 'nothing.*'", tmp_);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_EQ(count_lines(bad.err), 1) << bad.err;
  EXPECT_NE(bad.err.find("--only"), std::string::npos) << bad.err;
  bad = run_cli("quantize '" + in_.string() + "' '" + (tmp_ / "o3").string() + "' --format mxfp4 --input-amax 8", tmp_);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_EQ(count_lines(bad.err), 1) << bad.err;
}

TEST_F(QuantizeCli, BadInputGivesOneLineAndNonZeroExit) {
  // Missing input folder.
  RunResult r = run_cli("quantize '" + (tmp_ / "nope").string() + "' '" + (tmp_ / "o1").string() + "'", tmp_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;

  // Unknown format: a usage error.
  write_checkpoint(/*poison_nan=*/true);
  r = run_cli("quantize '" + in_.string() + "' '" + (tmp_ / "o2").string() + "' --format int4", tmp_);
  EXPECT_EQ(r.rc, 2) << r.err;

  // A NaN weight: names the tensor.
  r = run_cli("quantize '" + in_.string() + "' '" + (tmp_ / "o3").string() + "'", tmp_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("q_proj.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;

  // Non-empty output folder.
  fs::create_directories(tmp_ / "o4");
  std::ofstream(tmp_ / "o4" / "x") << "x";
  r = run_cli("quantize '" + in_.string() + "' '" + (tmp_ / "o4").string() + "'", tmp_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not empty"), std::string::npos) << r.err;
}

TEST_F(QuantizeCli, SingleFileCheckpoint) {
  std::mt19937 rng(5);
  const Src w = make_tensor("model.layers.0.mlp.down_proj.weight", DType::BF16, {32, 64}, rng, 0.1f);
  const Src n = make_tensor("model.norm.weight", DType::F32, {64}, rng, 1.0f);
  {
    SafetensorsWriter wr((in_ / "model.safetensors").string());
    wr.add(w.name, w.dtype, w.shape, w.bytes);
    wr.add(n.name, n.dtype, n.shape, n.bytes);
    wr.finish();
  }
  std::ofstream(in_ / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})";
  const fs::path out = tmp_ / "out";
  const RunResult r = run_cli("quantize '" + in_.string() + "' '" + out.string() + "'", tmp_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  const auto f = SafetensorsFile::open((out / "model.safetensors").string());
  EXPECT_EQ(f->tensors().size(), 4u);  // weight, weight_scale, weight_scale_2, norm
  const Fp4Matrix q = quantize_nvfp4(w.values.data(), 32, 64);
  const auto packed = f->bytes(f->get(w.name));
  ASSERT_EQ(packed.size(), q.packed.size());
  EXPECT_EQ(std::memcmp(packed.data(), q.packed.data(), q.packed.size()), 0);
  const auto norm = f->bytes(f->get(n.name));
  ASSERT_EQ(norm.size(), n.bytes.size());
  EXPECT_EQ(std::memcmp(norm.data(), n.bytes.data(), norm.size()), 0);
  EXPECT_EQ(json::parse(slurp(out / "config.json"))["quantization_config"]["quant_algo"], "W4A16_NVFP4");
}

TEST_F(QuantizeCli, RefusesAnAlreadyQuantizedCheckpoint) {
  write_checkpoint();
  const fs::path out = tmp_ / "out";
  ASSERT_EQ(run_cli("quantize '" + in_.string() + "' '" + out.string() + "'", tmp_).rc, 0);
  const RunResult r = run_cli("quantize '" + out.string() + "' '" + (tmp_ / "again").string() + "'", tmp_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fp4moe
