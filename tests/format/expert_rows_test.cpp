// Fp4ExpertRows / owned_expert_stack (format/moe_layer.hpp): expert stacks read in place from
// the mmap'd checkpoint (view mode, the GPU runner's upload input) give exactly the bytes of
// Checkpoint::load_moe_layer's owned copy — gate/up globals unified and block scales rescaled
// the same way — for NVFP4 (ModelOpt, compressed-tensors), MXFP4 and the BF16 shared expert.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "format/checkpoint.hpp"
#include "format/moe_layer.hpp"
#include "format/moe_views_fixture.hpp"

using namespace fp4moe;
using testing_ckpt::Layout;
using testing_ckpt::MoeViewsFixture;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  return fs::temp_directory_path() / fmt::format("fp4moe_expert_rows_{}_{}", name, ::getpid());
}

void expect_same_stack(const ExpertStack& a, const ExpertStack& b, const std::string& what) {
  EXPECT_FALSE(a.is_view()) << what;
  EXPECT_EQ(a.format, b.format) << what;
  EXPECT_EQ(a.num_experts, b.num_experts) << what;
  EXPECT_EQ(a.n, b.n) << what;
  EXPECT_EQ(a.k, b.k) << what;
  EXPECT_TRUE(a.packed == b.packed) << what;
  EXPECT_TRUE(a.scales == b.scales) << what;
  EXPECT_TRUE(a.global_scale == b.global_scale) << what;
  EXPECT_TRUE(a.bf16 == b.bf16) << what;
  EXPECT_EQ(a.input_scale, b.input_scale) << what;
}

class ExpertRows : public ::testing::TestWithParam<Layout> {};

TEST_P(ExpertRows, ViewsGiveTheBytesOfLoadMoeLayer) {
  const fs::path dir = temp_dir(std::to_string(int(GetParam())));
  MoeViewsFixture::write(GetParam(), dir);
  {
    const auto ck = Checkpoint::open(dir.string());
    const MoeLayerWeights owned = ck->load_moe_layer(1);
    const MoeLayerWeights views = MoeViewsFixture::view_layer(*ck, 1);
    ASSERT_TRUE(views.w13.is_view());
    ASSERT_NE(views.w13.format, WeightFormat::BF16);
    expect_same_stack(owned_expert_stack(views.w13), owned.w13, "w13");
    expect_same_stack(owned_expert_stack(views.w2), owned.w2, "w2");
    ASSERT_TRUE(owned.shared_w13 && owned.shared_w2);
    EXPECT_EQ(views.shared_w13->format, WeightFormat::BF16);
    expect_same_stack(owned_expert_stack(*views.shared_w13), *owned.shared_w13, "shared w13");
    expect_same_stack(owned_expert_stack(*views.shared_w2), *owned.shared_w2, "shared w2");
    // Row by row through Fp4ExpertRows too (what the sm90 re-layout reads).
    const int64_t nb = views.w13.k / views.w13.block();
    int64_t rescaled_rows = 0;
    for (int64_t e = 0; e < views.w13.num_experts; ++e) {
      const Fp4ExpertRows x(views.w13, e);
      EXPECT_EQ(x.global_scale(), owned.w13.global_scale[size_t(e)]);
      for (int64_t r = 0; r < views.w13.n; ++r) {
        rescaled_rows += x.rescaled(r);
        const size_t row = size_t(e * views.w13.n + r);
        ASSERT_EQ(0, std::memcmp(x.packed(r), owned.w13.packed.data() + row * size_t(views.w13.k / 2),
                                 size_t(views.w13.k / 2)));
        for (int64_t kb = 0; kb < nb; ++kb)
          ASSERT_EQ(x.scale(r, kb), owned.w13.scales[row * size_t(nb) + size_t(kb)]) << e << " " << r << " " << kb;
      }
    }
    // NVFP4: experts 0 and 2 have different gate/up globals, so one half of each is rescaled.
    if (views.w13.format == WeightFormat::NVFP4)
      EXPECT_EQ(rescaled_rows, 2 * MoeViewsFixture::I);
    else
      EXPECT_EQ(rescaled_rows, 0);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertRows, ::testing::Values(Layout::ModelOpt, Layout::Compressed, Layout::Mxfp4),
                         [](const auto& i) {
                           return std::string(i.param == Layout::ModelOpt     ? "ModelOptNvfp4"
                                              : i.param == Layout::Compressed ? "CompressedNvfp4"
                                                                              : "Mxfp4");
                         });

TEST(ExpertRowsNan, ANanBlockScaleInAViewThrows) {
  const fs::path dir = temp_dir("nan");
  MoeViewsFixture::write(Layout::ModelOpt, dir);
  {
    const auto ck = Checkpoint::open(dir.string());
    MoeLayerWeights views = MoeViewsFixture::view_layer(*ck, 1);
    for (int64_t e : {int64_t(0), int64_t(1)}) {  // 0: a rescaled part, 1: not rescaled
      ExpertStack s = views.w13;
      const int64_t n_part = MoeViewsFixture::I, nb = s.k / s.block();
      ExpertStack::PartView& v = s.views[size_t(e * 2)];
      std::vector<uint8_t> scales(v.scales, v.scales + n_part * nb);
      scales[5] = 0x7F;
      v.scales = scales.data();
      EXPECT_THROW(owned_expert_stack(s), Error) << e;
      EXPECT_THROW(Fp4ExpertRows(s, e).scale(0, 5), Error) << e;
      EXPECT_NO_THROW(Fp4ExpertRows(s, e).scale(0, 4)) << e;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
