// backend/decode_rows: a multi-token batch as a decode step of one-token requests (the GPU's
// speculative verify step). Each token's request: kv_len = position + 1, the first pages of its
// own request that cover it, and the same cache slot for its position as in the original batch;
// on the CPU model (make-synthetic glm5-tiny), the decode form of a verify batch gives the
// absorbed multi-token verify step's logits and final hidden states bit for bit (the rows'
// cache writes land where the original batch puts them, and row k reads rows < k).
#include <cstring>

#include <gtest/gtest.h>

#include "backend/decode_rows.hpp"
#include "cli/cli_run_helpers.hpp"
#include "core/error.hpp"
#include "model/model.hpp"

using namespace fp4moe;
using namespace fp4moe::engine;

namespace {

// Two requests: A verifies 4 tokens at positions 13..16 (pages 7, 2, 9 of 8 tokens), B 2 tokens
// at positions 3..4 (page 5) — the verify batch of a round with n = 3 and n = 1.
struct Batch {
  std::vector<int32_t> qo{0, 4, 6}, pos{13, 14, 15, 16, 3, 4}, len{17, 5}, pp{0, 3, 4}, pages{7, 2, 9, 5};
  KvBatchView view() const { return {2, 6, qo.data(), pos.data(), len.data(), pp.data(), pages.data()}; }
};

}  // namespace

TEST(DecodeRows, EveryTokenIsAOneTokenRequestAtTheEndOfItsContext) {
  const Batch b;
  const DecodeRows d = decode_rows(b.view(), 8);
  const KvBatchView v = d.view(b.view());
  ASSERT_EQ(v.num_requests, 6);
  ASSERT_EQ(v.num_tokens, 6);
  EXPECT_NO_THROW(validate_kv_batch(v, 8, 10));
  EXPECT_EQ(d.qo, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(d.kv_len, (std::vector<int32_t>{14, 15, 16, 17, 4, 5}));
  // Position 13..15 need 2 pages of 8, 16 needs 3; B's positions one page.
  EXPECT_EQ(d.page_indptr, (std::vector<int32_t>{0, 2, 4, 6, 9, 10, 11}));
  EXPECT_EQ(d.pages, (std::vector<int32_t>{7, 2, 7, 2, 7, 2, 7, 2, 9, 5, 5}));
  for (int64_t t = 0; t < 6; ++t) {
    EXPECT_EQ(v.positions[t], v.kv_len[t] - 1) << "token " << t << " is the last of its context";
    const int64_t r = t < 4 ? 0 : 1;  // the same slot as in the original batch: the same cache row
    EXPECT_EQ(kv_slot(v, 8, t, v.positions[t]), kv_slot(b.view(), 8, r, b.pos[size_t(t)])) << "token " << t;
  }
}

TEST(DecodeRows, ATokenOutsideItsRequestIsAnError) {
  Batch b;
  b.pos[3] = 17;  // beyond kv_len 17
  EXPECT_THROW(decode_rows(b.view(), 8), Error);
  Batch c;
  c.len[0] = 25;  // kv_len fine, but position 24 would need a 4th page: A has 3
  c.pos[3] = 24;
  EXPECT_THROW(decode_rows(c.view(), 8), Error);
  EXPECT_THROW(decode_rows(Batch{}.view(), 0), Error);
}

TEST(DecodeRows, OnTheCpuModelTheDecodeFormEqualsTheVerifyStepBitForBit) {
  static testing_cli::TempDir t("decode_rows_models");
  const auto dir = t.path / "glm5-tiny";
  ASSERT_EQ(testing_cli::run_binary(t.path, "make-synthetic " + dir.string() + " --preset glm5-tiny").rc, 0);
  model::ModelOptions mo;
  mo.threads = 1;
  auto m = model::Model::load(dir.string(), mo);
  const int64_t V = m->config().vocab, H = m->config().hidden, page = 8;
  model::HostKvPool kv(m->kv_geometry(page, 16, KvElem::F32), m->kv_index_layers());
  // Two requests: A with 13 cached tokens (pages 7, 2, 9), B with 3 (page 5); prefill them.
  const std::vector<int32_t> pa{7, 2, 9}, pb{5};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) prompt.push_back((11 + 53 * i) % int32_t(V));
  {
    std::vector<int32_t> tok(prompt.begin(), prompt.begin() + 13), pos;
    tok.insert(tok.end(), prompt.begin() + 13, prompt.begin() + 16);
    for (int i = 0; i < 13; ++i) pos.push_back(i);
    for (int i = 0; i < 3; ++i) pos.push_back(i);
    const std::vector<int32_t> qo{0, 13, 16}, len{13, 3}, pp{0, 3, 4}, pages{7, 2, 9, 5};
    std::vector<float> none;
    m->step(TensorView::of(tok.data(), {16}), {2, 16, qo.data(), pos.data(), len.data(), pp.data(), pages.data()}, kv,
            {}, TensorView::of(none.data(), {0, V}));
  }
  // The verify batch: A 4 tokens at 13..16, B 2 tokens at 3..4.
  const Batch b;
  const std::vector<int32_t> tok{101, 202, 303, 404, 505, 606};
  std::vector<int32_t> rows{0, 1, 2, 3, 4, 5};
  std::vector<float> la(size_t(6 * V)), lb(size_t(6 * V)), ha(size_t(6 * H)), hb(size_t(6 * H));
  model::StepExtras x;
  x.absorbed = true;
  x.final_hidden = ha.data();
  m->step(TensorView::of(tok.data(), {6}), b.view(), kv, rows, TensorView::of(la.data(), {6, V}), nullptr, x);
  const DecodeRows d = decode_rows(b.view(), page);
  x.final_hidden = hb.data();
  m->step(TensorView::of(tok.data(), {6}), d.view(b.view()), kv, rows, TensorView::of(lb.data(), {6, V}), nullptr, x);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0) << "logits";
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * 4), 0) << "final hidden states";
}
