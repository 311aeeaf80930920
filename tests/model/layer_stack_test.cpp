// model/layer_stack.hpp: the order of the ops the one layer stack runs (recorded by an op set
// that only logs), that a refusal (can_implement) stops the step with its reason before the op
// runs, and the CPU op set's own refusals of views it cannot take.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/paged_kv.hpp"
#include "model/cpu_ops.hpp"
#include "model/layer_stack.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

using namespace fp4moe;
using namespace fp4moe::model;

namespace {

// Logs every op it runs; refuses the op named in `refuse` (if any).
class RecordingOps final : public Ops {
 public:
  std::vector<std::string> log;
  std::string refuse;

  std::string why(const std::string& op) const { return op == refuse ? "refused: " + op : ""; }
  std::string can_implement(const EmbedArgs&) const override { return why("embed"); }
  std::string can_implement(const RmsNormArgs&) const override { return why("norm"); }
  std::string can_implement(const AttentionArgs&) const override { return why("attention"); }
  std::string can_implement(const AddArgs&) const override { return why("add"); }
  std::string can_implement(const FfnArgs&) const override { return why("ffn"); }
  std::string can_implement(const LinearArgs&) const override { return why("linear"); }
  std::string can_implement(const HeadArgs&) const override { return why("head"); }

  void run(const EmbedArgs& a) override { log.push_back(a.table == Table::Mtp ? "embed mtp" : "embed"); }
  void run(const RmsNormArgs& a) override {
    static const char* roles[] = {"input", "post", "final", "enorm", "hnorm", "shared_head"};
    log.push_back(fmt::format("norm {} {}{}", roles[int(a.role)], a.ref.layer, a.ref.mtp ? " mtp" : ""));
  }
  void run(const AttentionArgs& a) override {
    static const char* kinds[] = {"none", "full", "shared"};
    log.push_back(fmt::format("attention {} {}", a.ref.layer, kinds[int(a.indexer)]));
  }
  void run(const AddArgs&) override { log.push_back("add"); }
  void run(const FfnArgs& a) override { log.push_back(fmt::format("ffn {} {}", a.ref.layer, a.moe ? "moe" : "dense")); }
  void run(const LinearArgs&) override { log.push_back("eh_proj"); }
  void run(const HeadArgs& a) override { log.push_back(fmt::format("head {}", a.rows.size(0))); }
  void read(const TensorView& src, float* dst) override {
    log.push_back("read");
    for (int64_t i = 0; i < src.numel(); ++i) dst[i] = float(log.size());
  }
};

MlaModelConfig three_layers() {
  MlaModelConfig c;
  c.num_layers = 3;
  c.hidden = 4;
  c.vocab = 8;
  c.indexer = {IndexerKind::Full, IndexerKind::Shared, IndexerKind::Full};
  c.moe_layer = {false, true, true};
  return c;
}

}  // namespace

TEST(LayerStack, RunsEmbeddingBlocksFinalNormAndHeadInOrder) {
  const MlaModelConfig c = three_layers();
  std::vector<int32_t> tokens(2), rows = {1};
  std::vector<float> x(8), h(8), o(8), logits(8);
  HiddenStates hidden;
  ForwardViews v;
  v.tokens = TensorView::of(tokens.data(), {2});
  v.x = TensorView::of(x.data(), {2, 4});
  v.h = TensorView::of(h.data(), {2, 4});
  v.o = TensorView::of(o.data(), {2, 4});
  v.rows = TensorView::of(rows.data(), {1});
  v.logits = TensorView::of(logits.data(), {1, 8});
  v.hidden = &hidden;
  RecordingOps ops;
  forward(ops, c, v);
  std::vector<std::string> want = {"embed", "read"};
  for (int l = 0; l < 3; ++l) {
    const char* kind = l == 1 ? "shared" : "full";
    want.insert(want.end(), {fmt::format("norm input {}", l), fmt::format("attention {} {}", l, kind), "add",
                             fmt::format("norm post {}", l), fmt::format("ffn {} {}", l, l == 0 ? "dense" : "moe")});
    if (l < 2) want.push_back("read");
  }
  want.insert(want.end(), {"norm final 0", "read", "head 1"});
  EXPECT_EQ(ops.log, want);
  // transformers' output_hidden_states layout: embeddings, layers 0 .. L-2, after the final norm.
  EXPECT_EQ(hidden.size(), 4u);
  for (const auto& row : hidden) EXPECT_EQ(row.size(), 8u);
}

TEST(LayerStack, NoRowsNoHead) {
  const MlaModelConfig c = three_layers();
  std::vector<int32_t> tokens(1);
  std::vector<float> x(4), h(4), o(4);
  ForwardViews v;
  v.tokens = TensorView::of(tokens.data(), {1});
  v.x = TensorView::of(x.data(), {1, 4});
  v.h = TensorView::of(h.data(), {1, 4});
  v.o = TensorView::of(o.data(), {1, 4});
  v.rows = TensorView::of(tokens.data(), {0});
  RecordingOps ops;
  forward(ops, c, v);
  ASSERT_FALSE(ops.log.empty());
  EXPECT_EQ(ops.log.back(), "norm final 0");
}

TEST(LayerStack, MtpLayerRunsTheSameDecoderBlock) {
  MlaModelConfig c = three_layers();
  std::vector<int32_t> tokens(2), rows = {0, 1};
  std::vector<float> hin(8), eg(16), e(8), x(8), h(8), o(8), logits(16), hout(8);
  MtpViews v;
  v.tokens = TensorView::of(tokens.data(), {2});
  v.h_in = TensorView::of(hin.data(), {2, 4});
  v.eg = TensorView::of(eg.data(), {2, 8});
  v.e = TensorView::of(e.data(), {2, 4});
  v.x = TensorView::of(x.data(), {2, 4});
  v.h = TensorView::of(h.data(), {2, 4});
  v.o = TensorView::of(o.data(), {2, 4});
  v.rows = TensorView::of(rows.data(), {2});
  v.logits = TensorView::of(logits.data(), {2, 8});
  v.h_out = hout.data();
  RecordingOps ops;
  mtp_forward(ops, c, IndexerKind::Full, true, v);
  const std::vector<std::string> want = {"embed mtp", "norm enorm 3 mtp", "norm hnorm 3 mtp", "eh_proj",
                                         "norm input 3 mtp", "attention 3 full", "add", "norm post 3 mtp",
                                         "ffn 3 moe", "norm shared_head 3 mtp", "read", "head 2"};
  EXPECT_EQ(ops.log, want);
}

TEST(LayerStack, ARefusedOpStopsTheStepWithItsReasonBeforeItRuns) {
  const MlaModelConfig c = three_layers();
  std::vector<int32_t> tokens(1), rows = {0};
  std::vector<float> x(4), h(4), o(4), logits(8);
  ForwardViews v;
  v.tokens = TensorView::of(tokens.data(), {1});
  v.x = TensorView::of(x.data(), {1, 4});
  v.h = TensorView::of(h.data(), {1, 4});
  v.o = TensorView::of(o.data(), {1, 4});
  v.rows = TensorView::of(rows.data(), {1});
  v.logits = TensorView::of(logits.data(), {1, 8});
  for (const char* op : {"embed", "norm", "attention", "add", "ffn", "head"}) {
    RecordingOps ops;
    ops.refuse = op;
    try {
      forward(ops, c, v);
      ADD_FAILURE() << op << ": not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("refused: ") + op), std::string::npos) << e.what();
    }
    for (const std::string& line : ops.log) EXPECT_NE(line.rfind(op, 0), 0u) << op << " ran: " << line;
  }
}

// The CPU op set refuses views it cannot take (one line naming the view), layers it does not
// have, an FFN of the other kind, and (bound to a model without an MTP layer) the MTP ops.
TEST(CpuOps, RefusesViewsItCannotTakeAndMtpOpsWithoutAnMtpLayer) {
  const auto m = Model::load(testing_model::golden_dir("glm5-tiny-sparse") + "/model");
  const MlaModelConfig& c = m->config();
  HostKvPool kv(m->kv_geometry(16, 4, KvElem::F32), m->kv_index_layers());
  std::vector<int32_t> qo = {0, 2}, pos = {0, 1}, len = {2}, pp = {0, 1}, pages = {0};
  const KvBatchView b{1, 2, qo.data(), pos.data(), len.data(), pp.data(), pages.data()};
  Arena arena;
  CpuOps ops(c, m->weights(), m->options(), arena, kv, b, AttentionForm::Auto);
  ops.begin_step();
  const int64_t H = c.hidden;
  std::vector<float> x(size_t(2 * H)), y(size_t(2 * H));
  std::vector<uint16_t> y16(size_t(2 * H));
  const TensorView xv = TensorView::of(x.data(), {2, H}), yv = TensorView::of(y.data(), {2, H});
  EXPECT_EQ(ops.can_implement(RmsNormArgs{xv, yv, NormRole::Input, {0, false}}), "");
  const TensorView bf = TensorView::contiguous(y16.data(), DType::BF16, {2, H});
  EXPECT_NE(ops.can_implement(RmsNormArgs{xv, bf, NormRole::Input, {0, false}}).find("F32"), std::string::npos);
  EXPECT_NE(ops.can_implement(RmsNormArgs{xv, yv, NormRole::Input, {c.num_layers, false}}).find("layer"),
            std::string::npos);
  EXPECT_NE(ops.can_implement(AttentionArgs{{-1, false}, IndexerKind::Full, xv, yv}), "");
  const bool moe0 = m->weights().layers[0].is_moe;
  EXPECT_EQ(ops.can_implement(FfnArgs{{0, false}, moe0, xv, yv, xv}), "");
  EXPECT_NE(ops.can_implement(FfnArgs{{0, false}, !moe0, xv, yv, xv}).find("FFN op was asked"), std::string::npos);
  const TensorView short_rows = TensorView::of(x.data(), {1, H});
  EXPECT_NE(ops.can_implement(AddArgs{short_rows, yv}), "");
  if (!m->has_mtp()) {
    EXPECT_NE(ops.can_implement(LinearArgs{LinearRole::MtpEhProj, xv, yv}).find("MTP"), std::string::npos);
    EXPECT_NE(ops.can_implement(EmbedArgs{TensorView::of(qo.data(), {2}), xv, Table::Mtp}).find("MTP"),
              std::string::npos);
  }
  const std::vector<int32_t> one = {0};
  std::vector<float> logits(size_t(c.vocab));
  const TensorView one_row = TensorView::of(one.data(), {1});
  EXPECT_NE(ops.can_implement(HeadArgs{yv, one_row, TensorView::of(logits.data(), {1, c.vocab - 1})}), "");
  EXPECT_EQ(ops.can_implement(HeadArgs{yv, one_row, TensorView::of(logits.data(), {1, c.vocab})}), "");
}
