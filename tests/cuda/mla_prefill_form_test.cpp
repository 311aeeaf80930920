// The prefill form rule (cuda/attention/mla_prefill_form.hpp): host arithmetic only, no GPU.
#include <gtest/gtest.h>

#include "cuda/attention/mla_prefill_form.hpp"

namespace fp4moe::test {
namespace {

using cuda::attention::choose_mla_prefill_form;
using cuda::attention::MlaPrefillForm;

TEST(MlaPrefillForm, DecodeAndShortChunksStayAbsorbed) {
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
    EXPECT_EQ(choose_mla_prefill_form(1, 131072, e).form, MlaPrefillForm::Absorbed);
    EXPECT_EQ(choose_mla_prefill_form(16, 4096, e).form, MlaPrefillForm::Absorbed);
    EXPECT_EQ(choose_mla_prefill_form(64, 64, e).form, MlaPrefillForm::Absorbed);
  }
  EXPECT_EQ(choose_mla_prefill_form(0, 100, KvElem::BF16).form, MlaPrefillForm::Absorbed);
}

TEST(MlaPrefillForm, LongFreshPrefillsTakeTheExpandedForm) {
  for (int64_t n : {4096, 8192, 16384, 32768})
    for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3}) {
      const auto c = choose_mla_prefill_form(n, n, e);
      EXPECT_EQ(c.form, MlaPrefillForm::Expanded) << n;
      EXPECT_LT(c.expanded_us, c.absorbed_us);
    }
  // Measured at 5783e9e: 1K fresh is ~even with a BF16 cache, clearly expanded with FP8.
  EXPECT_EQ(choose_mla_prefill_form(1024, 1024, KvElem::FP8_E4M3).form, MlaPrefillForm::Expanded);
  EXPECT_EQ(choose_mla_prefill_form(512, 512, KvElem::BF16).form, MlaPrefillForm::Absorbed);
}

TEST(MlaPrefillForm, SwitchesOnceAsTheChunkGrows) {
  for (KvElem e : {KvElem::BF16, KvElem::FP8_E4M3})
    for (int64_t L : {2048, 32768, 131072}) {
      int switches = 0;
      MlaPrefillForm prev = MlaPrefillForm::Absorbed;
      for (int64_t q = 1; q <= L; q += 7) {
        const MlaPrefillForm f = choose_mla_prefill_form(q, L, e).form;
        switches += f != prev;
        prev = f;
      }
      EXPECT_EQ(switches, 1) << "L " << L;
    }
}

}  // namespace
}  // namespace fp4moe::test
