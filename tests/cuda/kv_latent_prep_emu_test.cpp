// kv_latent_prep's kernel (cuda/attention/kv_latent_prep.cuh) on the CPU through the CUDA emulator,
// against the CPU model's latent keys (RMSNorm + RoPE in FP32, then the cache's encoding):
// interleaved and halves RoPE, BF16 and FP8 caches, tokens of several requests with shuffled
// pages; the rows no token owns stay as they were. Needs no GPU (runs in CI); kv_latent_prep_test
// runs the same cases on the device.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/attention/kv_latent_prep.cuh"

#include <gtest/gtest.h>

#include <vector>

#include "cuda/kv_latent_prep_case.hpp"

namespace fp4moe::test {
namespace {

namespace lp = cuda::attention::latentprep;

// Runs the kernel over case c into poisoned pools (expect_latent_rows_match checks them).
void check(const LatentPrepCase& c, bool fp8) {
  const size_t rows = size_t(c.num_pages * c.page_size), e = fp8 ? 1 : 2;
  std::vector<uint8_t> ckv(rows * LatentPrepCase::kCkv * e, kLatentPoison), kpe(rows * LatentPrepCase::kKpe * e, kLatentPoison);
  lp::Params p{};
  p.kv = c.kv.data();
  p.kv_stride = LatentPrepCase::kRow;
  p.norm_w = c.w.data();
  p.eps = 1e-6f;
  p.interleaved = c.interleaved;
  p.inv_freq = c.rope.inv_freq.data();
  p.attn_factor = c.rope.attention_factor;
  p.ckv_out = ckv.data();
  p.kpe_out = kpe.data();
  p.fp8 = fp8;
  p.ckv_scale = fp8 ? kLatentFp8CkvScale : 1.0f;
  p.kpe_scale = fp8 ? kLatentFp8KpeScale : 1.0f;
  KvLayerView layer;
  layer.num_pages = c.num_pages;
  layer.page_size = c.page_size;
  p.slots = cuda::attention::kv_token_slots(layer, c.batch());
  const unsigned blocks = unsigned((c.tokens() + lp::kWarpsPerBlock - 1) / lp::kWarpsPerBlock);
  emu::launch(dim3(blocks), dim3(lp::kWarpsPerBlock * 32), 0, lp::kv_latent_prep_kernel, p);
  expect_latent_rows_match(c, ckv, kpe, fp8);
}

TEST(KvLatentPrepEmu, InterleavedRopeMatchesTheCpuModelInABf16Cache) {
  check(make_latent_prep_case({5, 40, 1, 300}, {5, 1, 1, 17}, /*interleaved=*/true, 1), false);
}

TEST(KvLatentPrepEmu, HalvesRopeMatchesTheCpuModelInABf16Cache) {
  check(make_latent_prep_case({5, 40, 1, 300}, {5, 1, 1, 17}, /*interleaved=*/false, 2), false);
}

TEST(KvLatentPrepEmu, BothRopeLayoutsMatchTheCpuModelInAnFp8Cache) {
  check(make_latent_prep_case({9, 70000, 33}, {9, 3, 2}, true, 3), true);
  check(make_latent_prep_case({9, 70000, 33}, {9, 3, 2}, false, 4), true);
}

}  // namespace
}  // namespace fp4moe::test
