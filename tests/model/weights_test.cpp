// Weight binding: NVIDIA's NVFP4 layout with an MTP layer (make-synthetic glm5-tiny), the MoE
// layer read in place (views) equal to the stacked copy, MXFP4 checkpoints.
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run_helpers.hpp"
#include "cpu/moe_cpu.hpp"
#include "format/fp4.hpp"
#include "format/safetensors.hpp"
#include "sequence_forward.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_cli;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<model::Model> synthetic(const TempDir& t, const std::string& preset) {
  const auto dir = t.path / preset;
  const Result r = run_binary(t.path, "make-synthetic " + dir.string() + " --preset " + preset);
  EXPECT_EQ(r.rc, 0) << r.err;
  model::ModelOptions o;
  o.threads = 2;
  return model::Model::load(dir.string(), o);
}

}  // namespace

TEST(Weights, NvidiaLayoutBindsBf16SharedExpertBesideNvfp4ExpertsAndKeepsTheMtpLayerApart) {
  TempDir t("weights_mtp");
  auto m = synthetic(t, "glm5-tiny");
  const model::MlaModelConfig& c = m->config();
  ASSERT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(int64_t(m->weights().layers.size()), c.num_layers);  // the MTP layer is not a decoder layer
  ASSERT_EQ(m->weights().mtp.size(), 1u);
  const model::MtpWeights& mtp = m->weights().mtp[0];
  EXPECT_EQ(mtp.eh_proj.w.n, c.hidden);
  EXPECT_EQ(mtp.eh_proj.w.k, 2 * c.hidden);
  EXPECT_TRUE(mtp.layer.is_moe);
  EXPECT_EQ(mtp.layer.moe.w13.format, WeightFormat::BF16);  // NVIDIA leaves the MTP layer unquantized
  const model::LayerWeights& moe = m->weights().layers.back();
  ASSERT_TRUE(moe.is_moe);
  EXPECT_EQ(moe.moe.w13.format, WeightFormat::NVFP4);
  ASSERT_TRUE(moe.moe.shared_w13.has_value());
  EXPECT_EQ(moe.moe.shared_w13->format, WeightFormat::BF16);
  EXPECT_EQ(moe.attn.kv_b.w.format, cpu::LinearFormat::BF16);
  EXPECT_GT(moe.moe.w13.views.size(), 0u);
  EXPECT_GT(moe.moe.w13.views[0].global_scale, 0.0f);
  testing_model::EngineGenerateOptions g;
  g.max_new_tokens = 4;
  const auto r = testing_model::generate_on_engine((t.path / "glm5-tiny").string(), {3, 4, 5, 6, 7}, g).result;
  EXPECT_EQ(r.tokens.size(), 9u);
}

TEST(Weights, MoeLayerViewedInPlaceEqualsTheStackedCopy) {
  TempDir t("weights_views");
  auto m = synthetic(t, "glm5-tiny");
  const int64_t l = m->config().num_layers - 1, H = m->config().hidden, T = 11;
  const MoeLayerWeights owned = m->checkpoint().load_moe_layer(l);
  const MoeLayerWeights& views = m->weights().layers[size_t(l)].moe;
  ASSERT_TRUE(views.w13.is_view());
  ASSERT_FALSE(owned.w13.is_view());
  // The W4A4 activation global (make-synthetic writes a nominal input_scale): the same both ways.
  EXPECT_GT(views.w13.input_scale, 0.0f);
  EXPECT_EQ(views.w13.input_scale, owned.w13.input_scale);
  EXPECT_EQ(views.w2.input_scale, owned.w2.input_scale);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<float> x(size_t(T * H));
  for (float& v : x) v = d(rng);
  CpuMoeOptions o;
  o.threads = 2;
  const MoeOutput a = moe_forward_cpu(owned, x.data(), T, o), b = moe_forward_cpu(views, x.data(), T, o);
  EXPECT_EQ(a.routing.topk_ids, b.routing.topk_ids);
  ASSERT_EQ(a.out.size(), b.out.size());
  for (size_t i = 0; i < a.out.size(); ++i) ASSERT_NEAR(a.out[i], b.out[i], 1e-5f * (1 + std::fabs(a.out[i]))) << i;
}

// MXFP4 values (E2M1 × 2^k) are exact in BF16, so the MXFP4 checkpoint and its dequantized
// BF16 copy describe the same model: their logits agree to FP32 rounding.
TEST(Weights, Mxfp4CheckpointEqualsItsDequantizedBf16Copy) {
  TempDir t("weights_mx");
  const std::string src = testing_model::golden_dir("glm5-tiny-sparse") + "/model";
  const fs::path mx_dir = t.path / "mx", bf_dir = t.path / "mx_bf16";
  const Result q = run_binary(t.path, "quantize " + src + " " + mx_dir.string() + " --format mxfp4");
  ASSERT_EQ(q.rc, 0) << q.err;
  {
    fs::create_directories(bf_dir);
    const auto in = SafetensorsFile::open((mx_dir / "model.safetensors").string());
    SafetensorsWriter w((bf_dir / "model.safetensors").string());
    for (const TensorInfo& ti : in->tensors()) {
      const std::string& n = ti.name;
      if (n.size() > 13 && n.compare(n.size() - 13, 13, ".weight_scale") == 0) continue;
      const TensorInfo* sc = in->find(n.substr(0, n.size() - 7) + ".weight_scale");
      if (ti.dtype != DType::U8 || !sc) {
        w.add(n, ti.dtype, ti.shape, in->bytes(ti));
        continue;
      }
      const int64_t rows = ti.shape[0], cols = ti.shape[1] * 2;
      const Fp4MatrixView v{Fp4Format::MXFP4, rows, cols, in->bytes(ti).data(), in->bytes(*sc).data(), 1.0f};
      std::vector<uint16_t> deq(size_t(rows * cols));
      dequantize_rows_bf16(v, 0, rows, deq.data());
      w.add(n, DType::BF16, {rows, cols}, deq);
    }
    w.finish();
    std::ifstream cf(mx_dir / "config.json");
    nlohmann::json c = nlohmann::json::parse(cf);
    c.erase("quantization_config");
    std::ofstream(bf_dir / "config.json") << c.dump(2);
  }
  model::ModelOptions o;
  o.threads = 2;
  auto mx = model::Model::load(mx_dir.string(), o);
  auto bf = model::Model::load(bf_dir.string(), o);
  EXPECT_EQ(mx->weights().layers[1].moe.w13.format, WeightFormat::MXFP4);
  EXPECT_EQ(mx->weights().layers[1].attn.q_b.w.format, cpu::LinearFormat::MXFP4);
  EXPECT_EQ(bf->weights().layers[1].attn.q_b.w.format, cpu::LinearFormat::BF16);
  testing_model::EngineGenerateOptions g;  // `fp4moe generate`'s path, --dump-logits
  g.max_new_tokens = 8;
  g.dump = engine::kDumpLogits;
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[size_t(i)] = 2 + 13 * i % 500;
  const auto a = testing_model::generate_on_engine(mx_dir.string(), prompt, g).result;
  const auto b = testing_model::generate_on_engine(bf_dir.string(), prompt, g).result;
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_LE(testing_model::rel_l2(a.logits.data(), b.logits.data(), a.logits.size()), 1e-5);
}

// A non-finite router weight is refused at load with one line naming the tensor, on every
// backend (the binder checks it; the correction bias was already checked).
TEST(Weights, NonFiniteRouterWeightIsRefusedAtLoad) {
  TempDir t("weights_router_nan");
  const auto dir = t.path / "glm5-tiny";
  const Result r = run_binary(t.path, "make-synthetic " + dir.string() + " --preset glm5-tiny");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string name;
  {
    model::ModelOptions o;
    o.threads = 2;
    const auto m = model::Model::load(dir.string(), o);
    name = "model.layers." + std::to_string(m->config().num_layers - 1) + ".mlp.gate.weight";
  }
  bool poked = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    uint64_t at = 0;
    DType dtype = DType::F32;
    {
      const auto f = SafetensorsFile::open(e.path().string());
      const TensorInfo* ti = f->find(name);
      if (!ti) continue;
      at = f->data_offset() + ti->begin + 2 * (ti->dtype == DType::F32 ? 4 : 2);  // the third value
      dtype = ti->dtype;
    }
    ASSERT_TRUE(dtype == DType::BF16 || dtype == DType::F32);
    std::fstream out(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(std::streamoff(at));
    const float inf = INFINITY;
    const uint16_t inf16 = 0x7F80;
    if (dtype == DType::F32) {
      out.write(reinterpret_cast<const char*>(&inf), 4);
    } else {
      out.write(reinterpret_cast<const char*>(&inf16), 2);
    }
    poked = true;
  }
  ASSERT_TRUE(poked) << name << " not found";
  model::ModelOptions o;
  o.threads = 2;
  try {
    model::Model::load(dir.string(), o);
    FAIL() << "a checkpoint with an infinite router weight loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router '" + name.substr(0, name.size() - std::string("gate.weight").size()) +
                                         "gate.weight' has a non-finite value inf at row 0, column 2"),
              std::string::npos)
        << e.what();
  }
}
