// GPU kv_append against cpu::kv_append_cpu: the whole pool (every byte, untouched slots
// included) must be identical, for BF16 and FP8 caches, several page sizes, decode tokens and a
// prefill chunk in one batch, pages out of order.
#include <gtest/gtest.h>

#include "cuda/attention/kv_append.hpp"
#include "cuda/attention_test_util.hpp"

namespace fp4moe::test {
namespace {

void check_append(int64_t page_size, KvElem elem, KvElem index_elem, bool with_index, uint64_t seed) {
  const std::vector<RequestShape> shapes = {{1, 1}, {70, 1}, {300, 37}, {int32_t(page_size * 3), int32_t(page_size)}, {5, 5}};
  PagedCase c = make_paged_case(shapes, page_size, elem, index_elem, seed, /*fill=*/false);
  const size_t T = size_t(c.tokens());
  const auto ckv = random_bf16(T * kCkvDim, seed + 11, 2.0f), kpe = random_bf16(T * kKpeDim, seed + 12, 2.0f),
             ik = random_bf16(T * kIndexDim, seed + 13, 2.0f);

  DeviceCache dc(c);  // poisoned pool (0xFF), as the host one
  DeviceBatch db(c);
  DeviceArray<uint16_t> d_ckv(ckv.bits), d_kpe(kpe.bits), d_ik(ik.bits);
  cuda::attention::KvAppendArgs a;
  a.ckv = d_ckv.ptr;
  a.kpe = d_kpe.ptr;
  a.index_k = with_index ? d_ik.ptr : nullptr;
  a.layer = dc.L;
  a.batch = db.view();
  cuda::attention::kv_append(a, nullptr);

  cpu::kv_append_cpu(c.layer(), c.batch(), ckv.f.data(), kpe.f.data(), with_index ? ik.f.data() : nullptr);
  EXPECT_EQ(dc.ckv.download(), c.ckv) << "ckv pool differs";
  EXPECT_EQ(dc.kpe.download(), c.kpe) << "kpe pool differs";
  EXPECT_EQ(dc.index_k.download(), c.index_k) << "index_k pool differs";
}

TEST(KvAppendTiny, PoolMatchesCpuBf16) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int64_t ps : {1, 16, 64}) check_append(ps, KvElem::BF16, KvElem::BF16, true, 100 + uint64_t(ps));
}

TEST(KvAppendTiny, PoolMatchesCpuFp8) {
  FP4MOE_SKIP_WITHOUT_GPU();
  for (int64_t ps : {1, 64}) check_append(ps, KvElem::FP8_E4M3, KvElem::FP8_E4M3, true, 200 + uint64_t(ps));
  check_append(64, KvElem::FP8_E4M3, KvElem::BF16, true, 300);
}

TEST(KvAppendTiny, WithoutIndexKeysLeavesIndexPoolUntouched) {
  FP4MOE_SKIP_WITHOUT_GPU();
  check_append(64, KvElem::BF16, KvElem::BF16, false, 400);
}

TEST(KvAppend, RejectsNonPowerOfTwoPageSize) {
  FP4MOE_SKIP_WITHOUT_GPU();
  PagedCase c = make_paged_case({{10, 1}}, 48, KvElem::BF16, KvElem::BF16, 1, false);
  DeviceCache dc(c);
  DeviceBatch db(c);
  DeviceArray<uint16_t> x(static_cast<size_t>(kCkvDim));
  cuda::attention::KvAppendArgs a;
  a.ckv = a.kpe = x.ptr;
  a.layer = dc.L;
  a.batch = db.view();
  try {
    cuda::attention::kv_append(a, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::test
