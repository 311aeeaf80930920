// The sm90 weight re-layout streamed from checkpoint views (the GPU runner's load path: per
// 128-row tile of one expert, straight into pinned staging, weight_layout.cpp) gives exactly
// the bytes of the owned path (Checkpoint::load_moe_layer, then relayout_weights_sm90 of the
// whole stack), for NVFP4 with rescaled gate/up globals and MXFP4, both layouts (SiluMul and
// the plain one). Host code only: runs without a GPU, in CPU-only builds too.
//
// DISABLED_TimeLoadPaths times the host side of both paths on a real checkpoint:
//   FP4MOE_TIME_LOAD_DIR=/tmp/glm5 weight_relayout_test --gtest_also_run_disabled_tests
//     --gtest_filter='*TimeLoad*'    (one command line; FP4MOE_TIME_LOAD_OWNED=0 skips the
//     owned path, which holds ~9 GB of host copies per GLM-5 layer)
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/threads.hpp"
#include "cuda/moe_gemm/weight_relayout.hpp"
#include "format/checkpoint.hpp"
#include "format/moe_layer.hpp"
#include "format/moe_views_fixture.hpp"

using namespace fp4moe;
using namespace fp4moe::cuda;
using testing_ckpt::Layout;
using testing_ckpt::MoeViewsFixture;
namespace fs = std::filesystem;

namespace {

// What the sm90 upload streams: every (expert, row tile) re-laid on its own, in device order.
std::vector<uint8_t> streamed_tiles(const ExpertStack& s, Epilogue ep) {
  check_relayout_sm90(s);
  const int64_t RT = s.n / 128;
  const size_t tile = sm90_row_tile_bytes(s.k);
  std::vector<uint8_t> out(size_t(s.num_experts * RT) * tile, 0xCD);
  for (int64_t e = 0; e < s.num_experts; ++e)
    for (int64_t rt = 0; rt < RT; ++rt)
      relayout_row_tile_sm90(Fp4ExpertRows(s, e), s.format, s.n, s.k, rt, ep, e, out.data() + size_t(e * RT + rt) * tile);
  return out;
}

class WeightRelayout : public ::testing::TestWithParam<Layout> {};

TEST_P(WeightRelayout, StreamedFromViewsEqualsTheOwnedHostPath) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("fp4moe_relayout_{}_{}", int(GetParam()), ::getpid());
  MoeViewsFixture::write(GetParam(), dir);
  {
    const auto ck = Checkpoint::open(dir.string());
    const MoeLayerWeights owned = ck->load_moe_layer(1);
    const MoeLayerWeights views = MoeViewsFixture::view_layer(*ck, 1);
    ASSERT_TRUE(views.w13.is_view() && !owned.w13.is_view());
    for (Epilogue ep : {Epilogue::SiluMul, Epilogue::None}) {
      for (const auto& [v, o, what] : {std::tuple{&views.w13, &owned.w13, "w13"}, std::tuple{&views.w2, &owned.w2, "w2"}}) {
        const std::vector<uint8_t> want = relayout_weights_sm90(*o, ep);
        ASSERT_EQ(want.size(), size_t(o->num_experts) * size_t(o->n / 128) * sm90_row_tile_bytes(o->k));
        EXPECT_TRUE(streamed_tiles(*v, ep) == want) << what << " epilogue " << int(ep);
        EXPECT_TRUE(relayout_weights_sm90(*v, ep) == want) << what << " epilogue " << int(ep);
        EXPECT_TRUE(streamed_tiles(*o, ep) == want) << what << " epilogue " << int(ep);
      }
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, WeightRelayout, ::testing::Values(Layout::ModelOpt, Layout::Mxfp4),
                         [](const auto& i) { return std::string(i.param == Layout::ModelOpt ? "Nvfp4" : "Mxfp4"); });

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Host side of loading every MoE layer of FP4MOE_TIME_LOAD_DIR (e.g. make-synthetic --preset
// glm5-layer), both ways, plus a plain copy of every BF16 tensor as the loader stages it.
TEST(WeightRelayoutTiming, DISABLED_TimeLoadPaths) {
  const char* d = std::getenv("FP4MOE_TIME_LOAD_DIR");
  if (!d) GTEST_SKIP() << "set FP4MOE_TIME_LOAD_DIR to a checkpoint folder";
  const auto ck = Checkpoint::open(d);
  const int threads = default_num_threads();
  fmt::print("{} host threads\n", threads);
  constexpr size_t kStage = size_t(64) << 20;  // one staging buffer, reused (StagedUpload's chunk)
  std::vector<uint8_t> stage(kStage);
  for (int64_t l = 0; l < ck->config().num_layers; ++l) {
    if (!ck->config().is_moe_layer(l)) continue;
    const MoeLayerWeights views = MoeViewsFixture::view_layer(*ck, l);
    // Packed codes + block scales (weight_bytes_per_expert counts the 4-byte global too).
    const double gb = double((views.w13.weight_bytes_per_expert() - 4 + views.w2.weight_bytes_per_expert() - 4) *
                             size_t(views.w13.num_experts)) / 1e9;
    // The owned path (before the streaming loader): an owned copy of the layer
    // (load_moe_layer), then each whole stack re-laid into one host array (both parallel).
    std::string owned_line;
    const char* owned_env = std::getenv("FP4MOE_TIME_LOAD_OWNED");
    if (!owned_env || std::string(owned_env) != "0") {
      auto t0 = std::chrono::steady_clock::now();
      MoeLayerWeights owned = ck->load_moe_layer(l);
      const double t_load = since(t0);
      t0 = std::chrono::steady_clock::now();
      for (auto [s, ep] : {std::pair{&owned.w13, Epilogue::SiluMul}, std::pair{&owned.w2, Epilogue::RowScale}})
        EXPECT_GT(relayout_weights_sm90(*s, ep).size(), 0u);
      const double t_relayout = since(t0);
      owned_line = fmt::format("owned path: load_moe_layer {:.2f} s ({:.2f} GB/s) + whole-stack re-layout {:.2f} s "
                               "({:.2f} GB/s); ",
                               t_load, gb / t_load, t_relayout, gb / t_relayout);
    }
    // Streamed: tiles straight from the views into a 64 MB buffer (the staging), on the threads.
    const auto t0 = std::chrono::steady_clock::now();
    size_t streamed = 0;
    for (auto [s, ep] : {std::pair{&views.w13, Epilogue::SiluMul}, std::pair{&views.w2, Epilogue::RowScale}}) {
      const int64_t RT = s->n / 128, items = s->num_experts * RT;
      const size_t tile = sm90_row_tile_bytes(s->k);
      const int64_t per = int64_t(kStage / tile);
      for (int64_t i0 = 0; i0 < items; i0 += per)
        parallel_for(std::min(per, items - i0), threads, 1, [&](int64_t a, int64_t b) {
          for (int64_t i = i0 + a; i < i0 + b; ++i)
            relayout_row_tile_sm90(Fp4ExpertRows(*s, i / RT), s->format, s->n, s->k, i % RT, ep, i / RT,
                                   stage.data() + size_t(i - i0) * tile);
        });
      streamed += size_t(items) * tile;
    }
    const double t_stream = since(t0);
    fmt::print("layer {}: {:.2f} GB of FP4 experts ({:.2f} GB re-laid). {}streamed re-layout from the views {:.2f} s "
               "({:.2f} GB/s)\n",
               l, gb, double(streamed) / 1e9, owned_line, t_stream, gb / t_stream);
  }
  // BF16 / F32 tensors (everything but the FP4 experts) copied into the staging, as Loader::upload does.
  size_t bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& f : ck->files())
    for (const TensorInfo& t : f->tensors()) {
      if (t.dtype != DType::BF16 && t.dtype != DType::F32) continue;
      const auto src = f->bytes(t);
      for (size_t off = 0; off < src.size(); off += kStage) {
        const size_t n = std::min(kStage, src.size() - off);
        parallel_for(int64_t((n + (1 << 20) - 1) >> 20), threads, 1, [&](int64_t a, int64_t b) {
          const size_t lo = size_t(a) << 20, hi = std::min(n, size_t(b) << 20);
          std::memcpy(stage.data() + lo, src.data() + off + lo, hi - lo);
        });
      }
      bytes += src.size();
    }
  const double t_copy = since(t0);
  fmt::print("BF16/F32 tensors: {:.2f} GB copied into staging in {:.2f} s ({:.2f} GB/s)\n", double(bytes) / 1e9, t_copy,
             double(bytes) / 1e9 / t_copy);
}

}  // namespace
