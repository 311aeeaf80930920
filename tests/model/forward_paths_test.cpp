// The forward pass's own consistency: prefill (expanded MLA) vs token-by-token decode
// (absorbed MLA) over the same cache, both MLA forms on one path, and a batch of requests of
// different lengths (each with its own page table) vs each request alone.
#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.hpp"
#include "model/model.hpp"
#include "cli/cli_run_helpers.hpp"
#include "model_test_util.hpp"
#include "sequence_forward.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_model;

namespace {

std::vector<int32_t> golden_prompt(const std::string& name, int64_t n) {
  const auto f = SafetensorsFile::open(golden_dir(name.substr(0, name.find(':'))) + "/golden.safetensors");
  const auto t = read_tensor<int32_t>(*f, "tokens");
  return {t.begin(), t.begin() + n};
}

// A golden model folder, or (name ending in ":nvfp4_all") its `fp4moe quantize` copy.
std::string model_dir(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos) return golden_dir(name) + "/model";
  static testing_cli::TempDir tmp("forward_paths");
  const auto out = tmp.path / name.substr(0, colon);
  if (!std::filesystem::exists(out)) {
    const auto r = testing_cli::run_binary(tmp.path, "quantize " + golden_dir(name.substr(0, colon)) + "/model " + out.string());
    EXPECT_EQ(r.rc, 0) << r.err;
  }
  return out.string();
}

std::unique_ptr<model::Model> load(const std::string& name, model::AttentionForm form = model::AttentionForm::Auto) {
  model::ModelOptions o;
  o.threads = 2;
  o.attention = form;
  return model::Model::load(model_dir(name), o);
}

// Every row's relative L2 difference.
double worst_row(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double w = 0;
  for (size_t r = 0; r < a.size() / size_t(vocab); ++r)
    w = std::max(w, rel_l2(a.data() + r * size_t(vocab), b.data() + r * size_t(vocab), size_t(vocab)));
  return w;
}

}  // namespace

TEST(ForwardPaths, PrefillLogitsEqualTokenByTokenDecodeLogitsWithin1em4) {
  for (const char* name : {"glm5-tiny-sparse", "glm5-tiny-shared", "deepseek-v3-tiny-yarn"})
    for (KvElem kv : {KvElem::F32, KvElem::BF16, KvElem::FP8_E4M3}) {
      auto m = load(name);
      ForwardOptions o;
      o.kv_elem = kv;
      const auto seq = golden_prompt(name, 67);  // a 64-token prompt, then 3 decode steps
      const auto prefill = forward_sequence(*m, seq, 64, o);
      o.token_by_token = true;
      const auto decode = forward_sequence(*m, seq, 64, o);
      ASSERT_EQ(prefill.logits.size(), decode.logits.size());
      // F32 cache: the two attention forms differ by FP32 rounding only. BF16 / FP8 caches: a key
      // or latent element the two paths compute ~1e-7 apart can round to neighbouring stored
      // values (one BF16 ulp = 2^-8 relative), a discrete event whose effect depends on the
      // summation order of the FP32 dots; measured up to 1.7e-4 (glm5-tiny-sparse, BF16) with the
      // batch-invariant weight dot (cpu/avx2_weight_dot.hpp), so 5e-4 there.
      const double bound = kv == KvElem::F32 ? 1e-4 : 5e-4;
      EXPECT_LE(worst_row(prefill.logits, decode.logits, m->config().vocab), bound)
          << name << " kv " << kv_elem_name(kv);
    }
}

TEST(ForwardPaths, ExpandedAndAbsorbedMlaAgreeWithin1em5OnTheSamePrefill) {
  for (const char* name : {"glm5-tiny-sparse", "deepseek-v3-tiny-yarn", "glm5-tiny-sparse:nvfp4_all"}) {
    std::vector<float> out[2];
    int i = 0;
    for (auto form : {model::AttentionForm::Expanded, model::AttentionForm::Absorbed}) {
      auto m = load(name, form);
      out[i++] = forward_sequence(*m, golden_prompt(name, 65), 64).logits;  // the prefill, then a decode step
    }
    EXPECT_LE(worst_row(out[0], out[1], 512), 1e-5) << name;
  }
}

TEST(ForwardPaths, BatchOfRequestsWithOwnPageTablesEqualsEachRequestAlone) {
  auto m = load("glm5-tiny-sparse");
  const int64_t V = m->config().vocab, page = 4;
  const auto all = golden_prompt("glm5-tiny-sparse", 64);
  // Request A: a 40-token prefill; request B: 23 tokens already cached, decoding its 24th.
  const std::vector<int32_t> a(all.begin(), all.begin() + 40), b(all.begin() + 40, all.begin() + 64);
  model::HostKvPool kv(m->kv_geometry(page, 64, KvElem::F32), m->kv_index_layers());
  std::vector<int32_t> pages_b(6), pages_a(10);  // B's pages come first in the pool, A's in reverse order
  std::iota(pages_b.begin(), pages_b.end(), 0);
  std::iota(pages_a.rbegin(), pages_a.rend(), 6);
  // Prefill B's first 23 tokens alone.
  {
    std::vector<int32_t> pos(23);
    std::iota(pos.begin(), pos.end(), 0);
    const int32_t qo[2] = {0, 23}, len[1] = {23}, pp[2] = {0, 6};
    const KvBatchView bv{1, 23, qo, pos.data(), len, pp, pages_b.data()};
    m->step(TensorView::of(b.data(), {23}), bv, kv, {}, {});
  }
  // One step: A's 40 tokens and B's 24th token.
  std::vector<int32_t> tokens(a), pos(40), pages(pages_a);
  std::iota(pos.begin(), pos.end(), 0);
  tokens.push_back(b[23]);
  pos.push_back(23);
  pages.insert(pages.end(), pages_b.begin(), pages_b.end());
  const int32_t qo[3] = {0, 40, 41}, len[2] = {40, 24}, pp[3] = {0, 10, 16};
  const KvBatchView bv{2, 41, qo, pos.data(), len, pp, pages.data()};
  std::vector<float> both(size_t(3 * V));
  m->step(TensorView::of(tokens.data(), {41}), bv, kv, {0, 39, 40}, TensorView::of(both.data(), {3, V}));

  // Each alone, in fresh caches.
  const auto ra = forward_sequence(*m, a, int64_t(a.size()));
  const auto rb = forward_sequence(*m, b, int64_t(b.size()));
  EXPECT_LE(rel_l2(both.data(), ra.logits.data(), size_t(V)), 1e-5);
  EXPECT_LE(rel_l2(both.data() + V, ra.logits.data() + 39 * V, size_t(V)), 1e-5);
  EXPECT_LE(rel_l2(both.data() + 2 * V, rb.logits.data() + 23 * V, size_t(V)), 1e-4);  // decode vs prefill form
}
