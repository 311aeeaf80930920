#include "model/layer_stack.hpp"

namespace fp4moe::model {
namespace {

// The columns [begin, end) of a [T, n] view (the same rows, a narrower row).
TensorView columns(const TensorView& v, int64_t begin, int64_t end) { return v.slice(1, begin, end); }

bool has_rows(const TensorView& rows) { return rows.ndim == 1 && rows.size(0) > 0; }

void keep(Ops& ops, const TensorView& v, HiddenStates* hidden) {
  if (!hidden) return;
  std::vector<float> row(size_t(v.numel()));
  ops.read(v, row.data());
  hidden->push_back(std::move(row));
}

}  // namespace

void decoder_block(Ops& ops, LayerRef ref, IndexerKind indexer, bool moe, const TensorView& x, const TensorView& h,
                   const TensorView& o) {
  ops.mark(Stage::Attention, ref.layer);
  run_op(ops, RmsNormArgs{x, h, NormRole::Input, ref});
  run_op(ops, AttentionArgs{ref, indexer, h, o});
  run_op(ops, AddArgs{x, o});
  run_op(ops, RmsNormArgs{x, h, NormRole::PostAttention, ref});
  ops.mark(moe ? Stage::Moe : Stage::Dense, ref.layer);
  run_op(ops, FfnArgs{ref, moe, h, o, x});
}

void forward(Ops& ops, const MlaModelConfig& c, const ForwardViews& v) {
  ops.mark(Stage::Embed, -1);
  run_op(ops, EmbedArgs{v.tokens, v.x, Table::Target});
  if (v.hidden) v.hidden->clear();
  keep(ops, v.x, v.hidden);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    decoder_block(ops, LayerRef{l, false}, c.indexer[size_t(l)], bool(c.moe_layer[size_t(l)]), v.x, v.h, v.o);
    if (l + 1 < c.num_layers) keep(ops, v.x, v.hidden);
  }
  ops.mark(Stage::LmHead, -1);
  run_op(ops, RmsNormArgs{v.x, v.h, NormRole::Final, {}});
  keep(ops, v.h, v.hidden);
  if (v.final_hidden) ops.read(v.h, v.final_hidden);
  if (has_rows(v.rows)) run_op(ops, HeadArgs{v.h, v.rows, v.logits, Table::Target});
  ops.mark(Stage::Sampling, -1);  // the end of the last stage
}

void mtp_forward(Ops& ops, const MlaModelConfig& c, IndexerKind indexer, bool moe, const MtpViews& v) {
  const int64_t H = c.hidden;
  const LayerRef ref{c.num_layers, true};
  run_op(ops, EmbedArgs{v.tokens, v.e, Table::Mtp});
  run_op(ops, RmsNormArgs{v.e, columns(v.eg, 0, H), NormRole::MtpEmbed, ref});  // embedding first
  run_op(ops, RmsNormArgs{v.h_in, columns(v.eg, H, 2 * H), NormRole::MtpHidden, ref});
  run_op(ops, LinearArgs{LinearRole::MtpEhProj, v.eg, v.x});
  decoder_block(ops, ref, indexer, moe, v.x, v.h, v.o);
  ops.mark(Stage::LmHead, -1);
  run_op(ops, RmsNormArgs{v.x, v.h, NormRole::MtpSharedHead, ref});
  if (v.h_out) ops.read(v.h, v.h_out);
  if (has_rows(v.rows)) run_op(ops, HeadArgs{v.h, v.rows, v.logits, Table::Mtp});
}

}  // namespace fp4moe::model
