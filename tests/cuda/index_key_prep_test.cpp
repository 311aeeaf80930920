// index_key_prep on the GPU (cuda/indexer/indexer.hpp): the emulator test's cases
// (index_key_prep_emu_test) on the device, against the CPU model's indexer key, into a poisoned
// pool; a GLM-5-sized batch; the errors for what the fused kernel does not take.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "cuda/index_key_prep_case.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/moe_test_util.hpp"
#include "gpu_test.hpp"

namespace fp4moe::test {
namespace {

namespace ix = cuda::indexer;

void check_on_gpu(const KeyPrepCase& c, bool fp8) {
  const size_t rows = size_t(c.num_pages * c.page_size), bytes = rows * KeyPrepCase::kDim * (fp8 ? 1 : 2);
  DeviceArray<uint16_t> k(c.k);
  DeviceArray<float> w(c.w), b(c.b), inv_freq(c.rope.inv_freq);
  DeviceArray<int32_t> qo(c.qo_indptr), pos(c.positions), kvl(c.kv_len), pip(c.page_indptr), pidx(c.page_indices);
  DeviceArray<uint8_t> pool(std::vector<uint8_t>(bytes, kKeyPrepPoison));
  ix::IndexKeyPrepArgs a;
  a.k = k.ptr;
  a.ln_w = w.ptr;
  a.ln_b = b.ptr;
  a.rope_dim = c.rope_dim;
  a.interleaved = c.interleaved;
  a.inv_freq = inv_freq.ptr;
  a.attn_factor = c.rope.attention_factor;
  a.layer.index_k = pool.ptr;
  a.layer.index_dim = KeyPrepCase::kDim;
  a.layer.num_pages = c.num_pages;
  a.layer.page_size = c.page_size;
  a.layer.index_elem = fp8 ? KvElem::FP8_E4M3 : KvElem::BF16;
  a.layer.index_scale = fp8 ? kKeyPrepFp8Scale : 1.0f;
  a.batch = {int64_t(c.kv_len.size()), c.tokens(), qo.ptr, pos.ptr, kvl.ptr, pip.ptr, pidx.ptr};
  ix::index_key_prep(a, nullptr);
  expect_key_rows_match(c, pool.download(), fp8, kKeyPrepFp8Scale);
}

TEST(IndexKeyPrepTiny, BothRopeLayoutsMatchTheCpuModelInBf16AndFp8Caches) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (bool interleaved : {true, false})
    for (bool fp8 : {false, true}) check_on_gpu(make_key_prep_case({5, 40, 1, 300}, {5, 1, 1, 17}, interleaved, 10), fp8);
}

TEST(IndexKeyPrep, ADecodeBatchOf256AndAPrefillChunkMatchTheCpuModel) {
  FP4MOE_SKIP_WITHOUT_GPU();
  std::vector<int> ctx(256), fresh(256, 1);
  for (int i = 0; i < 256; ++i) ctx[size_t(i)] = 1 + (i * 997) % 20000;
  check_on_gpu(make_key_prep_case(ctx, fresh, true, 11), false);
  check_on_gpu(make_key_prep_case({4096, 70000}, {4096, 700}, true, 12), true);
}

TEST(IndexKeyPrepErrors, DimsTheKernelDoesNotTakeAreAnError) {  // refused before any device work
  EXPECT_EQ(ix::index_key_prep_can_implement(128, 64, true), "");
  EXPECT_NE(ix::index_key_prep_can_implement(64, 32, true), "");
  EXPECT_NE(ix::index_key_prep_can_implement(128, 63, true), "");
  EXPECT_NE(ix::index_key_prep_can_implement(128, 60, false), "");  // halves: a multiple of 8
  ix::IndexKeyPrepArgs a;  // index_dim 0
  EXPECT_THROW(ix::index_key_prep(a, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe::test
