// index_key_prep's kernel (cuda/indexer/index_key_prep.cuh) on the CPU through the CUDA emulator,
// against the CPU model's indexer key (LayerNorm + RoPE in FP32, then the cache's encoding):
// interleaved and halves RoPE, BF16 and FP8 caches, tokens of several requests with shuffled
// pages; the rows no token owns stay as they were. Needs no GPU (runs in CI); index_key_prep_test
// runs the same cases on the device.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/indexer/index_key_prep.cuh"

#include <gtest/gtest.h>

#include <vector>

#include "cuda/index_key_prep_case.hpp"

namespace fp4moe::test {
namespace {

namespace kp = cuda::indexer::keyprep;

// Runs the kernel over case c into a poisoned pool (expect_key_rows_match checks it).
void check(const KeyPrepCase& c, bool fp8) {
  const float scale = kKeyPrepFp8Scale;
  const size_t rows = size_t(c.num_pages * c.page_size), bytes = rows * KeyPrepCase::kDim * (fp8 ? 1 : 2);
  std::vector<uint8_t> pool(bytes, kKeyPrepPoison);
  kp::Params p{};
  p.k = c.k.data();
  p.k_stride = KeyPrepCase::kDim;
  p.ln_w = c.w.data();
  p.ln_b = c.b.data();
  p.eps = 1e-6f;
  p.rope_dim = c.rope_dim;
  p.interleaved = c.interleaved;
  p.inv_freq = c.rope.inv_freq.data();
  p.attn_factor = c.rope.attention_factor;
  p.out = pool.data();
  p.fp8 = fp8;
  p.scale = scale;
  KvLayerView layer;
  layer.num_pages = c.num_pages;
  layer.page_size = c.page_size;
  p.slots = cuda::attention::kv_token_slots(layer, c.batch());
  const unsigned blocks = unsigned((c.tokens() + kp::kWarpsPerBlock - 1) / kp::kWarpsPerBlock);
  emu::launch(dim3(blocks), dim3(kp::kWarpsPerBlock * 32), 0, kp::index_key_prep_kernel, p);

  expect_key_rows_match(c, pool, fp8, scale);
}

TEST(IndexKeyPrepEmu, InterleavedRopeMatchesTheCpuModelInABf16Cache) {
  check(make_key_prep_case({5, 40, 1, 300}, {5, 1, 1, 17}, /*interleaved=*/true, 1), false);
}

TEST(IndexKeyPrepEmu, HalvesRopeMatchesTheCpuModelInABf16Cache) {
  check(make_key_prep_case({5, 40, 1, 300}, {5, 1, 1, 17}, /*interleaved=*/false, 2), false);
}

TEST(IndexKeyPrepEmu, BothRopeLayoutsMatchTheCpuModelInAnFp8Cache) {
  check(make_key_prep_case({9, 70000, 33}, {9, 3, 2}, true, 3), true);
  check(make_key_prep_case({9, 70000, 33}, {9, 3, 2}, false, 4), true);
}

}  // namespace
}  // namespace fp4moe::test
