// The sharding arithmetic (--tp / --ep) on GLM-5's real dimensions, its one-line errors,
// and the per-rank checkpoint reads: the byte ranges computed from the safetensors headers,
// read with pread, equal the rank's slice cut from the whole tensor, and the ranks' slices of
// a split tensor tile it exactly once.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "engine/dist/read_plan.hpp"
#include "engine/dist/shard_plan.hpp"
#include "format/checkpoint.hpp"

using namespace fp4moe;
using namespace fp4moe::dist;
namespace fs = std::filesystem;

namespace {

model::MlaModelConfig glm5_dims() {
  model::MlaModelConfig c;
  c.vocab = 154880;
  c.hidden = 6144;
  c.num_layers = 78;
  c.intermediate = 12288;
  c.num_heads = 64;
  c.q_lora_rank = 2048;
  c.kv_lora_rank = 512;
  c.qk_nope_dim = 192;
  c.qk_rope_dim = 64;
  c.v_head_dim = 256;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.moe.hidden = 6144;
  c.moe.inter = 2048;
  c.moe.num_experts = 256;
  c.moe.top_k = 8;
  c.moe.shared_inter = 2048;
  c.moe_layer.assign(78, true);
  for (int i = 0; i < 3; ++i) c.moe_layer[size_t(i)] = false;
  c.indexer.assign(78, model::IndexerKind::Full);
  return c;
}

std::string error_of(const model::MlaModelConfig& c, ParallelConfig p) {
  try {
    plan_shards(c, p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShardPlan, Glm5Tp8OwnsAnEighthOfEveryTpDimension) {
  const ShardPlan plan = plan_shards(glm5_dims(), {8, 8});
  ASSERT_EQ(plan.ranks.size(), 8u);
  const RankShard& r3 = plan.ranks[3];
  EXPECT_EQ(r3.heads, (Range{24, 32}));
  EXPECT_EQ(r3.q_rows, (Range{24 * 256, 32 * 256}));       // qk_head_dim 192 + 64
  EXPECT_EQ(r3.kv_b_rows, (Range{24 * 448, 32 * 448}));    // nope 192 + v 256 per head
  EXPECT_EQ(r3.o_cols, (Range{24 * 256, 32 * 256}));       // v 256 per head
  EXPECT_EQ(r3.dense_inter, (Range{3 * 1536, 4 * 1536}));
  EXPECT_EQ(r3.shared_inter, (Range{3 * 256, 4 * 256}));
  EXPECT_EQ(r3.vocab, (Range{3 * 19360, 4 * 19360}));
  EXPECT_EQ(r3.experts, (Range{96, 128}));
  EXPECT_EQ(r3.expert_inter, (Range{0, 2048}));
}

TEST(ShardPlan, RangesTileEachDimensionExactlyOnce) {
  for (const ParallelConfig p : {ParallelConfig{1, 1}, {2, 2}, {4, 1}, {1, 8}, {8, 8}, {1, 3}, {1, 7}}) {
    const ShardPlan plan = plan_shards(glm5_dims(), p);
    int64_t next_expert = 0;
    for (const RankShard& s : plan.ranks) {
      if (p.ep == 1) {
        EXPECT_EQ(s.experts, (Range{0, 256}));
      } else {
        EXPECT_EQ(s.experts.begin, next_expert);
        next_expert = s.experts.end;
      }
    }
    if (p.ep > 1) {
      EXPECT_EQ(next_expert, 256);
    }
    int64_t heads = 0;
    for (int64_t r = 0; r < p.tp; ++r) heads += plan.ranks[size_t(r)].heads.size();
    EXPECT_EQ(heads, 64);
  }
}

TEST(ShardPlan, TpOneEpOneIsTheWholeModel) {
  const RankShard s = plan_shards(glm5_dims(), {1, 1}).ranks.at(0);
  EXPECT_EQ(s.heads, (Range{0, 64}));
  EXPECT_EQ(s.vocab, (Range{0, 154880}));
  EXPECT_EQ(s.experts, (Range{0, 256}));
  EXPECT_EQ(s.expert_inter, (Range{0, 2048}));
}

TEST(ShardPlan, ImpossibleSplitsAreOneLineErrors) {
  const auto c = glm5_dims();
  EXPECT_NE(error_of(c, {3, 1}).find("64 attention heads are not divisible by 3"), std::string::npos);
  EXPECT_NE(error_of(c, {1, 300}).find("only 256 routed experts"), std::string::npos);
  EXPECT_NE(error_of(c, {2, 4}).find("tp and ep must be equal"), std::string::npos);
  EXPECT_NE(error_of(c, {0, 1}).find("--tp 0"), std::string::npos);
  auto odd = c;
  odd.moe.shared_inter = 1000;  // 125 columns per rank at tp 8
  EXPECT_NE(error_of(odd, {8, 8}).find("shared expert's intermediate size / 8 = 125 per rank is not a multiple of 16"),
            std::string::npos)
      << error_of(odd, {8, 8});
  for (const auto& msg : {error_of(c, {3, 1}), error_of(c, {1, 300})}) EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(ShardPlan, KvBytesPerTokenPerRankIsTheWholeLatent) {
  // 78 layers × (512 + 64) BF16 + 78 indexer keys × 128 BF16: MLA's latent is not split by TP.
  EXPECT_EQ(kv_bytes_per_token_per_rank(glm5_dims(), KvElem::BF16, KvElem::BF16), size_t(78 * (576 * 2 + 128 * 2)));
}

// ---- per-rank reads -------------------------------------------------------------------

std::string golden_model(const std::string& name) {
  return std::string(FP4MOE_SOURCE_DIR) + "/tests/model/golden/" + name + "/model";
}

std::vector<uint8_t> pread_all(const TensorRead& r) {
  std::vector<uint8_t> out(size_t(r.bytes.total()));
  const int fd = ::open(r.file.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  for (uint64_t i = 0; i < r.bytes.count; ++i)
    EXPECT_EQ(::pread(fd, out.data() + i * r.bytes.length, r.bytes.length, off_t(r.bytes.offset + i * r.bytes.stride)),
              ssize_t(r.bytes.length));
  ::close(fd);
  return out;
}

// The slice as the tensor's elements: rows [r0, r1), or the stored columns of logical
// columns [c0, c1) of k, cut here element by element from the whole tensor's bytes.
std::vector<uint8_t> cut(const SafetensorsFile& f, const TensorInfo& t, const TensorRead& r, int64_t k) {
  const auto all = f.bytes(t);
  if (r.kind == SliceKind::Whole) return {all.begin(), all.end()};
  if (r.kind == SliceKind::Skip) return {};
  const int64_t n = t.shape[0], m = t.shape.size() > 1 ? t.shape[1] : 1;
  const size_t elem = all.size() / size_t(n * m);
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const bool in = r.kind == SliceKind::Rows ? r.logical.contains(i) : r.logical.contains(j * k / m);
      if (in) out.insert(out.end(), all.begin() + (i * m + j) * elem, all.begin() + (i * m + j + 1) * elem);
    }
  return out;
}

void check_plan(const std::string& dir, ParallelConfig par) {
  const auto ck = Checkpoint::open(dir);
  const model::MlaModelConfig cfg = model::parse_mla_model_config(ck->config_json(), ck->config(), dir);
  const ShardPlan plan = plan_shards(cfg, par);
  std::map<std::string, uint64_t> covered;  // name -> bytes read over the ranks of one tp/ep group
  for (const RankShard& s : plan.ranks) {
    const RankReadPlan rp = plan_rank_reads(*ck, cfg, s);
    for (const TensorRead& r : rp.reads) {
      const SafetensorsFile* f = nullptr;
      const TensorInfo* t = ck->find(r.name, &f);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(pread_all(r), cut(*f, *t, r, tensor_split(r.name, cfg, s).k)) << r.name << " rank " << s.rank;
      if (r.kind != SliceKind::Whole || r.name.find(".mlp.experts.") != std::string::npos)
        covered[r.name] += r.bytes.total();
    }
  }
  for (const auto& [name, bytes] : covered) {
    const TensorInfo* t = ck->find(name);
    const TensorSplit sp = tensor_split(name, cfg, plan.ranks[0]);
    const bool split = sp.kind == SliceKind::Rows || sp.kind == SliceKind::Cols ||
                       (name.find(".mlp.experts.") != std::string::npos && par.ep > 1);
    if (split) {
      EXPECT_EQ(bytes, t->nbytes()) << name;
    }
  }
}

TEST(ReadPlan, GoldenGlm5TinyTp2) { check_plan(golden_model("glm5-tiny-sparse"), {2, 1}); }
TEST(ReadPlan, GoldenGlm5TinyEp4) { check_plan(golden_model("glm5-tiny-sparse"), {1, 4}); }
TEST(ReadPlan, GoldenGlm5TinyTp2Ep2) { check_plan(golden_model("glm5-tiny-sparse"), {2, 2}); }
TEST(ReadPlan, GoldenGlm5TinyEp3Uneven) { check_plan(golden_model("glm5-tiny-sparse"), {1, 3}); }

TEST(ReadPlan, RankReadsOnlyItsSlices) {
  const std::string dir = golden_model("glm5-tiny-sparse");
  const auto ck = Checkpoint::open(dir);
  const auto cfg = model::parse_mla_model_config(ck->config_json(), ck->config(), dir);
  const uint64_t whole = plan_rank_reads(*ck, cfg, plan_shards(cfg, {1, 1}).ranks[0]).bytes();
  // At tp = ep = 2 every split of this model is even: a rank reads the replicated tensors
  // whole and half of every split one (half the experts, half of every TP tensor).
  uint64_t replicated = 0, split = 0;
  for (const TensorInfo& t : ck->files()[0]->tensors()) {
    const bool is_split = t.name.find(".mlp.experts.") != std::string::npos ||
                          tensor_split(t.name, cfg, plan_shards(cfg, {2, 2}).ranks[0]).kind != SliceKind::Whole;
    (is_split ? split : replicated) += t.nbytes();
  }
  ASSERT_EQ(replicated + split, whole);
  ASSERT_GT(split, 0u);
  for (const RankShard& s : plan_shards(cfg, {2, 2}).ranks) EXPECT_EQ(plan_rank_reads(*ck, cfg, s).bytes(), replicated + split / 2);
}

TEST(ReadPlan, TinyShapesThatCannotSplitAreOneLineErrors) {
  const std::string dir = golden_model("glm5-tiny-sparse");
  const auto ck = Checkpoint::open(dir);
  const auto cfg = model::parse_mla_model_config(ck->config_json(), ck->config(), dir);
  try {
    plan_shards(cfg, {4, 1});  // shared expert 32 / 4 = 8 columns per rank
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared expert"), std::string::npos) << e.what();
  }
}

// NVFP4 layout (packed [n, k/2] U8, scales [n, k/16], scalar global scales): column slices in
// stored columns, a cut inside a scale block refused.
TEST(ReadPlan, Fp4ColumnSlicesFollowPackedBytesAndScaleBlocks) {
  const fs::path dir = fs::temp_directory_path() / ("fp4moe_dist_fp4_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(golden_model("glm5-tiny-sparse") + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  {
    SafetensorsWriter w((dir / "model.safetensors").string());
    std::vector<uint8_t> packed(64 * 64), scales(64 * 8), scales1(64 * 1), f4(4, 0);
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(i * 7);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i * 13);
    w.add("model.layers.0.self_attn.o_proj.weight", DType::U8, {64, 64}, packed);          // k = 128
    w.add("model.layers.0.self_attn.o_proj.weight_scale", DType::U8, {64, 8}, scales);     // 16 columns each
    w.add("model.layers.0.self_attn.o_proj.weight_scale_2", DType::F32, {}, f4);
    w.add("model.layers.1.mlp.shared_experts.down_proj.weight", DType::U8, {64, 16}, std::vector<uint8_t>(64 * 16, 1));
    w.add("model.layers.1.mlp.shared_experts.down_proj.weight_scale", DType::U8, {64, 1}, scales1);  // one 32-block
    w.finish();
  }
  const auto ck = Checkpoint::open(dir.string());
  const auto cfg = model::parse_mla_model_config(ck->config_json(), ck->config(), dir.string());
  const RankShard s1 = plan_shards(cfg, {2, 1}).ranks[1];
  try {
    plan_rank_reads(*ck, cfg, s1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared_experts.down_proj.weight_scale"), std::string::npos) << e.what();
  }
  // o_proj alone: rank 1 owns logical columns [64, 128) = packed bytes [32, 64), scales [4, 8).
  RankShard only_o = s1;
  only_o.shared_inter = {0, 32};
  const RankReadPlan rp = plan_rank_reads(*ck, cfg, only_o);
  for (const TensorRead& r : rp.reads) {
    if (r.name == "model.layers.0.self_attn.o_proj.weight") {
      EXPECT_EQ(r.kind, SliceKind::Cols);
      EXPECT_EQ(r.shape, (std::vector<int64_t>{64, 32}));
      const auto got = pread_all(r);
      for (int64_t i = 0; i < 64; ++i)
        for (int64_t j = 0; j < 32; ++j) ASSERT_EQ(got[size_t(i * 32 + j)], uint8_t((i * 64 + 32 + j) * 7));
    }
  }
  fs::remove_all(dir);
}

}  // namespace
