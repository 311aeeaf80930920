// kv_latent_prep on the GPU (cuda/attention/kv_append.hpp): the emulator test's cases
// (kv_latent_prep_emu_test) on the device, against the CPU model's latent keys, into poisoned
// pools; a GLM-5-sized decode batch and a prefill chunk; the errors for what the fused kernel
// does not take.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "cuda/attention/kv_append.hpp"
#include "cuda/kv_latent_prep_case.hpp"
#include "cuda/moe_test_util.hpp"
#include "gpu_test.hpp"

namespace fp4moe::test {
namespace {

namespace at = cuda::attention;

void check_on_gpu(const LatentPrepCase& c, bool fp8) {
  const size_t rows = size_t(c.num_pages * c.page_size), e = fp8 ? 1 : 2;
  DeviceArray<uint16_t> kv(c.kv);
  DeviceArray<float> w(c.w), inv_freq(c.rope.inv_freq);
  DeviceArray<int32_t> qo(c.qo_indptr), pos(c.positions), kvl(c.kv_len), pip(c.page_indptr), pidx(c.page_indices);
  DeviceArray<uint8_t> ckv(std::vector<uint8_t>(rows * LatentPrepCase::kCkv * e, kLatentPoison)),
      kpe(std::vector<uint8_t>(rows * LatentPrepCase::kKpe * e, kLatentPoison));
  at::KvLatentPrepArgs a;
  a.kv = kv.ptr;
  a.kv_stride = LatentPrepCase::kRow;
  a.norm_w = w.ptr;
  a.interleaved = c.interleaved;
  a.inv_freq = inv_freq.ptr;
  a.attn_factor = c.rope.attention_factor;
  a.layer.ckv = ckv.ptr;
  a.layer.kpe = kpe.ptr;
  a.layer.ckv_dim = LatentPrepCase::kCkv;
  a.layer.kpe_dim = LatentPrepCase::kKpe;
  a.layer.num_pages = c.num_pages;
  a.layer.page_size = c.page_size;
  a.layer.elem = fp8 ? KvElem::FP8_E4M3 : KvElem::BF16;
  a.layer.ckv_scale = fp8 ? kLatentFp8CkvScale : 1.0f;
  a.layer.kpe_scale = fp8 ? kLatentFp8KpeScale : 1.0f;
  a.batch = {int64_t(c.kv_len.size()), c.tokens(), qo.ptr, pos.ptr, kvl.ptr, pip.ptr, pidx.ptr};
  at::kv_latent_prep(a, nullptr);
  expect_latent_rows_match(c, ckv.download(), kpe.download(), fp8);
}

TEST(KvLatentPrepTiny, BothRopeLayoutsMatchTheCpuModelInBf16AndFp8Caches) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (bool interleaved : {true, false})
    for (bool fp8 : {false, true})
      check_on_gpu(make_latent_prep_case({5, 40, 1, 300}, {5, 1, 1, 17}, interleaved, 10), fp8);
}

TEST(KvLatentPrep, ADecodeBatchOf256AndAPrefillChunkMatchTheCpuModel) {
  FP4MOE_SKIP_WITHOUT_GPU();
  std::vector<int> ctx(256), fresh(256, 1);
  for (int i = 0; i < 256; ++i) ctx[size_t(i)] = 1 + (i * 997) % 20000;
  check_on_gpu(make_latent_prep_case(ctx, fresh, true, 11), false);
  check_on_gpu(make_latent_prep_case({4096, 70000}, {4096, 700}, true, 12), true);
}

TEST(KvLatentPrepErrors, WhatTheKernelDoesNotTakeIsAnError) {  // refused before any device work
  EXPECT_EQ(at::kv_latent_prep_can_implement(512, 64), "");
  EXPECT_NE(at::kv_latent_prep_can_implement(256, 64), "");
  EXPECT_NE(at::kv_latent_prep_can_implement(512, 32), "");
  at::KvLatentPrepArgs a;  // dims 0
  EXPECT_THROW(at::kv_latent_prep(a, nullptr), Error);
  a.layer.ckv_dim = 512;
  a.layer.kpe_dim = 64;  // null pointers
  EXPECT_THROW(at::kv_latent_prep(a, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe::test
