// Model::mtp_step: the MTP (next-n) layer over a step's flat tokens — the draft of speculative
// decoding (DeepSeek-V3 report §2.2; the serving systems' NextN modules). See model.hpp.
#include <cstring>

#include "core/error.hpp"
#include "cpu/linear_cpu.hpp"
#include "model/model.hpp"
#include "model/step_scratch.hpp"

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
  const int32_t* tokens = token_view.ptr<const int32_t>();
  Step s;
  begin_step(b, s);
  const float eps = float(c.rms_norm_eps);

  // [e | g]: [T, 2H]; e = enorm(embed(token)), g = hnorm(h_in) (SGLang's and vLLM's order).
  float* eg = arena_.alloc<float>(size_t(T * 2 * H));
  float* e = arena_.alloc<float>(size_t(T * H));
  const cpu::LinearView& emb = m.embed ? m.embed->w : w_.embed.w;
  for (int64_t t = 0; t < T; ++t) cpu::linear_row_cpu(emb, tokens[t], e + t * H);
  rms_norm_rows(e, T, H, H, m.enorm.weight.data(), eps, eg, 2 * H);
  rms_norm_rows(h_in, T, H, H, m.hnorm.weight.data(), eps, eg + H, 2 * H);
  float* x = arena_.alloc<float>(size_t(T * H));
  float* h = arena_.alloc<float>(size_t(T * H));
  float* o = arena_.alloc<float>(size_t(T * H));
  cpu::linear_cpu(m.eh_proj.w, eg, T, x, threads());

  block(c.num_layers, m.layer, kind, x, h, o, b, kv, s);
  rms_norm_rows(x, T, H, H, m.shared_head_norm.weight.data(), eps, h, H);
  if (h_out) std::memcpy(h_out, h, size_t(T * H) * sizeof(float));
  head_rows(m.head ? m.head->w : w_.lm_head.w, h, logits_rows, logits_rows.empty() ? nullptr : logits_view.ptr<float>());
}

}  // namespace fp4moe::model
