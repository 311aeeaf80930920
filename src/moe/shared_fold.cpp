// Shared-expert folding: see shared_fold.hpp.
#include "moe/shared_fold.hpp"

#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"

namespace fp4moe::moe {

int64_t shared_fold_pieces(const MoeLayerWeights& w, int64_t max_pieces, std::string* why) {
  const MoeConfig& c = w.cfg;
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return int64_t(0);
  };
  if (c.shared_inter <= 0 || !w.shared_w13 || !w.shared_w2) return no("");
  if (!w.w13.is_fp4() || w.shared_w13->format != w.w13.format || w.shared_w2->format != w.w2.format ||
      w.w13.format != w.w2.format)
    return no(fmt::format("shared expert is {}/{}, routed experts {}/{}", weight_format_name(w.shared_w13->format),
                          weight_format_name(w.shared_w2->format), weight_format_name(w.w13.format),
                          weight_format_name(w.w2.format)));
  if (c.inter <= 0 || c.shared_inter % c.inter != 0)
    return no(fmt::format("shared_inter {} is not a multiple of inter {}", c.shared_inter, c.inter));
  const int64_t n = c.shared_inter / c.inter;
  if (n > max_pieces) return no(fmt::format("{} pieces exceed the maximum of {}", n, max_pieces));
  if (c.inter % w.w2.block() != 0)
    return no(fmt::format("inter {} is not a multiple of the block size {}", c.inter, w.w2.block()));
  return n;
}

SharedPieces split_shared_expert(const MoeLayerWeights& w, int64_t n_sh) {
  const MoeConfig& c = w.cfg;
  FP4MOE_CHECK(n_sh >= 1 && w.shared_w13 && w.shared_w2 && c.shared_inter == n_sh * c.inter,
               "split_shared_expert: {} pieces of {} do not make shared_inter {}", n_sh, c.inter, c.shared_inter);
  const ExpertStack& g = *w.shared_w13;  // [1, 2SI, H]
  const ExpertStack& d = *w.shared_w2;   // [1, H, SI]
  const int64_t H = c.hidden, I = c.inter, SI = c.shared_inter;
  FP4MOE_CHECK(g.num_experts == 1 && g.n == 2 * SI && g.k == H && d.num_experts == 1 && d.n == H && d.k == SI,
               "split_shared_expert: shared expert shapes [{}, {}, {}] / [{}, {}, {}]", g.num_experts, g.n, g.k,
               d.num_experts, d.n, d.k);
  const int64_t gb = g.block(), db = d.block();
  FP4MOE_CHECK(I % db == 0 && I % 2 == 0, "split_shared_expert: inter {} is not a multiple of the block {}", I, db);
  SharedPieces p;
  ExpertStack& a = p.w13;
  a.format = g.format;
  a.num_experts = n_sh;
  a.n = 2 * I;
  a.k = H;
  a.packed.resize(size_t(n_sh * 2 * I * (H / 2)));
  a.scales.resize(size_t(n_sh * 2 * I * (H / gb)));
  a.global_scale.assign(size_t(n_sh), g.global_scale.empty() ? 1.0f : g.global_scale[0]);
  const size_t prow = size_t(H / 2), srow = size_t(H / gb);
  for (int64_t j = 0; j < n_sh; ++j)
    for (int64_t half = 0; half < 2; ++half) {  // 0: gate rows, 1: up rows
      const int64_t src_row = half * SI + j * I, dst_row = j * 2 * I + half * I;
      std::memcpy(a.packed.data() + size_t(dst_row) * prow, g.packed.data() + size_t(src_row) * prow, size_t(I) * prow);
      std::memcpy(a.scales.data() + size_t(dst_row) * srow, g.scales.data() + size_t(src_row) * srow, size_t(I) * srow);
    }
  ExpertStack& b = p.w2;
  b.format = d.format;
  b.num_experts = n_sh;
  b.n = H;
  b.k = I;
  b.packed.resize(size_t(n_sh * H * (I / 2)));
  b.scales.resize(size_t(n_sh * H * (I / db)));
  b.global_scale.assign(size_t(n_sh), d.global_scale.empty() ? 1.0f : d.global_scale[0]);
  for (int64_t j = 0; j < n_sh; ++j)
    for (int64_t r = 0; r < H; ++r) {
      std::memcpy(b.packed.data() + size_t((j * H + r) * (I / 2)), d.packed.data() + size_t(r * (SI / 2) + j * I / 2),
                  size_t(I / 2));
      std::memcpy(b.scales.data() + size_t((j * H + r) * (I / db)), d.scales.data() + size_t(r * (SI / db) + j * I / db),
                  size_t(I / db));
    }
  return p;
}

}  // namespace fp4moe::moe
