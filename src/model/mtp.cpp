// Model::mtp_step: the MTP (next-n) layer over a step's flat tokens — the draft of speculative
// decoding (DeepSeek-V3 report §2.2; the serving systems' NextN modules). See model.hpp.
#include <cstring>

#include "core/error.hpp"
#include "model/cpu_ops.hpp"
#include "model/model.hpp"

namespace fp4moe::model {

PagedKvGeometry Model::mtp_kv_geometry(int64_t page_size, int64_t num_pages, KvElem elem) const {
  PagedKvGeometry g = kv_geometry(page_size, num_pages, elem);
  g.num_layers = cfg_.num_layers + 1;
  return g;
}

std::vector<bool> Model::mtp_kv_index_layers() const {
  std::vector<bool> v = kv_index_layers();
  v.push_back(has_mtp() && w_.mtp[0].layer.attn.indexer.has_value());
  return v;
}

void Model::mtp_step(const TensorView& token_view, const float* h_in, const KvBatchView& b, HostKvPool& kv,
                     const std::vector<int32_t>& logits_rows, const TensorView& logits_view, float* h_out) {
  const MlaModelConfig& c = cfg_;
  FP4MOE_CHECK(has_mtp(), "the checkpoint has no MTP layer (model.layers.{}.*)", c.num_layers);
  const MtpWeights& m = w_.mtp[0];
  // The block's indexer: its own ("full"), none (DeepSeek-V3), or "shared" — which would reuse
  // an earlier layer's top-k in the same step, and the MTP step has none.
  const IndexerKind kind = m.layer.attn.indexer ? IndexerKind::Full
                           : c.has_indexer()    ? IndexerKind::Shared
                                                : IndexerKind::None;
  FP4MOE_CHECK(kind != IndexerKind::Shared,
               "the MTP layer has no indexer weights of its own (model.layers.{}.self_attn.indexer.*): a shared top-k "
               "has no earlier layer to come from in the draft step",
               c.num_layers);
  check_step(token_view, b, kv, logits_rows, logits_view, c.num_layers + 1);
  const int64_t T = b.num_tokens, H = c.hidden;
  CpuOps ops(cfg_, w_, opt_, arena_, kv, b, opt_.attention);
  ops.begin_step();
  MtpViews v;
  v.tokens = token_view;
  v.h_in = TensorView::of(h_in, {T, H});
  v.eg = TensorView::of(arena_.alloc<float>(size_t(T * 2 * H)), {T, 2 * H});  // [e | g], embedding first
  v.e = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.x = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.h = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.o = TensorView::of(arena_.alloc<float>(size_t(T * H)), {T, H});
  v.rows = TensorView::of(logits_rows.data(), {int64_t(logits_rows.size())});
  if (!logits_rows.empty()) v.logits = logits_view;
  v.h_out = h_out;
  mtp_forward(ops, c, kind, m.layer.is_moe, v);
}

}  // namespace fp4moe::model
