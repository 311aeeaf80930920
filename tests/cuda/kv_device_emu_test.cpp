// cuda/attention/kv_device.cuh's request_of (compiled for the CPU through the CUDA emulator's
// definitions): every token's request against a linear scan, on decode batches (one token per
// request: the two-load path), prefill chunks and batches with empty requests (the binary
// search), including a decode-looking prefix followed by a longer request.
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#include "cuda/attention/kv_device.cuh"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace fp4moe::test {
namespace {

void check_requests(const std::vector<int32_t>& qo) {
  const int R = int(qo.size()) - 1, T = qo.back();
  for (int t = 0; t < T; ++t) {
    int want = -1;
    for (int r = 0; r < R; ++r)
      if (qo[size_t(r)] <= t && t < qo[size_t(r) + 1]) want = r;
    ASSERT_EQ(cuda::attention::request_of(qo.data(), R, t), want) << "token " << t << " of " << T << ", " << R << " requests";
  }
}

TEST(KvDeviceEmu, RequestOfEveryTokenMatchesALinearScan) {
  check_requests({0, 1, 2, 3, 4});           // decode
  check_requests({0, 1});                    // one token
  check_requests({0, 5});                    // one prefill chunk
  check_requests({0, 1, 2, 3, 10, 11});      // decode rows, then a chunk, then a decode row
  check_requests({0, 0, 1, 1, 2, 2, 5});     // empty requests between
  check_requests({0, 1, 1, 2});              // an empty request: token 1 is request 2's
  std::mt19937 g(5);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<int32_t> qo = {0};
    const int R = 1 + int(g() % 40);
    for (int r = 0; r < R; ++r) qo.push_back(qo.back() + int(g() % 4 == 0 ? g() % 5 : 1));  // mostly 1, else 0-4
    if (qo.back() == 0) qo.back() = 1;
    check_requests(qo);
  }
}

}  // namespace
}  // namespace fp4moe::test
