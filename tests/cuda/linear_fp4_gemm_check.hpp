// Shared test harness of the linear-layout grouped GEMMs (Generic, DequantCublas): random
// FP4 experts, the CPU reference (cpu/grouped_gemm_ref.hpp), a GPU run with poisoned outputs,
// and the checks (every row written, rows past the offsets untouched, and EVERY row within the
// bound on its own: the row's ||y - ref|| / ||ref||).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "cpu/grouped_gemm_ref.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "format/fp4.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe::test {

using cuda::Epilogue;
using cuda::LinearFp4Weights;
using cuda::MoeGemmArgs;
using cuda::MoeGemmDesc;

struct GemmCase {
  WeightFormat format = WeightFormat::NVFP4;
  int n = 0, k = 0;
  Epilogue epilogue = Epilogue::None;
  std::vector<int> counts;  // tokens per expert (E = counts.size())
  int extra_rows = 0;       // rows of x / y past the last expert (must stay untouched)
  uint64_t seed = 1;
};

inline std::string case_name(const GemmCase& c) {
  const char* epi = c.epilogue == Epilogue::None ? "none" : c.epilogue == Epilogue::SiluMul ? "silu" : "rowscale";
  int total = 0;
  for (int m : c.counts) total += m;
  return std::string(weight_format_name(c.format)) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " E=" + std::to_string(c.counts.size()) + " M=" + std::to_string(total) + " " + epi;
}

// Random FP4 experts: uniformly random E2M1 codes, block scales drawn from a range of finite
// codes (NVFP4: E4M3 0.125..8 plus a few subnormals; MXFP4: E8M0 2^-6..2^3), global ~1/64.
inline ExpertStack random_expert_stack(WeightFormat f, int experts, int n, int k, std::mt19937_64& rng) {
  ExpertStack s;
  s.format = f;
  s.num_experts = experts;
  s.n = n;
  s.k = k;
  s.packed.resize(size_t(experts) * n * (k / 2));
  s.scales.resize(size_t(experts) * n * (k / s.block()));
  s.global_scale.resize(size_t(experts));
  for (size_t i = 0; i < s.packed.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(s.packed.data() + i, &r, std::min<size_t>(8, s.packed.size() - i));
  }
  std::uniform_int_distribution<int> e4m3(0x20, 0x57);   // 2^-3 .. 1.875 * 2^3
  std::uniform_int_distribution<int> sub(0x01, 0x07);    // E4M3 subnormals
  std::uniform_int_distribution<int> e8m0(121, 130);
  for (auto& b : s.scales)
    b = f == WeightFormat::MXFP4 ? uint8_t(e8m0(rng)) : uint8_t((rng() % 64 == 0) ? sub(rng) : e4m3(rng));
  std::uniform_real_distribution<float> g(0.5f / 64, 2.0f / 64);
  for (auto& v : s.global_scale) v = f == WeightFormat::MXFP4 ? 1.0f : g(rng);
  return s;
}

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

inline std::vector<int32_t> offsets_from_counts(const std::vector<int>& counts) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

// Tokens per expert of T tokens routed top-k over E experts by random logits.
inline std::vector<int> random_routing_counts(int tokens, int experts, int top_k, std::mt19937_64& rng) {
  std::vector<int> counts(static_cast<size_t>(experts), 0), ids(static_cast<size_t>(experts), 0);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) ids[size_t(e)] = e;
    for (int i = 0; i < top_k; ++i) {  // partial Fisher-Yates = top-k of iid logits
      const int j = i + int(rng() % uint64_t(experts - i));
      std::swap(ids[size_t(i)], ids[size_t(j)]);
      ++counts[size_t(ids[size_t(i)])];
    }
  }
  return counts;
}

// Runs one grouped GEMM implementation on the case's random data; host_offsets is the host
// copy of the device offsets.
using GemmRunner = std::function<void(const MoeGemmDesc&, const LinearFp4Weights&, const MoeGemmArgs&,
                                      std::span<const int32_t> host_offsets)>;

// Builds the case, runs it (poisoned y), checks it; returns the worst row's relative error.
inline double check_grouped_gemm(const GemmCase& c, const GemmRunner& run, double tol = 1e-2) {
  std::mt19937_64 rng(c.seed);
  const int experts = int(c.counts.size());
  const ExpertStack w = random_expert_stack(c.format, experts, c.n, c.k, rng);
  const std::vector<int32_t> off = offsets_from_counts(c.counts);
  const int rows = off.back();
  const int m_total = rows + c.extra_rows;
  const int n_out = c.epilogue == Epilogue::SiluMul ? c.n / 2 : c.n;
  const std::vector<uint16_t> x = random_bf16(size_t(m_total) * c.k, rng);
  std::vector<float> rs(static_cast<size_t>(m_total));
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  for (auto& v : rs) v = ud(rng);

  cuda::DeviceLinearFp4Weights dw(w);
  const cuda::DeviceBuffer dx = cuda::DeviceBuffer::from(x), doff = cuda::DeviceBuffer::from(off),
                           drs = cuda::DeviceBuffer::from(rs);
  cuda::DeviceBuffer dy(std::max<size_t>(size_t(m_total) * n_out * 2, 16));
  FP4MOE_CUDA_CHECK(cudaMemset(dy.ptr(), 0xFF, dy.bytes()));  // bf16 0xFFFF = NaN

  MoeGemmDesc d;
  d.num_experts = experts;
  d.n = c.n;
  d.k = c.k;
  d.max_tokens = m_total;
  d.weight = c.format;
  d.epilogue = c.epilogue;
  MoeGemmArgs a;
  a.x = dx.ptr();
  a.expert_offsets = doff.as<int32_t>();
  a.row_scale = drs.as<float>();
  a.y = dy.ptr();
  a.m_total = m_total;
  run(d, dw.view(), a, off);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> y = dy.download<uint16_t>(size_t(m_total) * n_out);

  const GroupedGemmRef r{&w, x.data(), m_total, off.data(), rs.data(), c.epilogue, false};
  std::vector<int64_t> all(static_cast<size_t>(rows));
  for (int m = 0; m < rows; ++m) all[size_t(m)] = m;
  const std::vector<double> ref = grouped_gemm_reference(r, all);

  int64_t unwritten = 0, touched = 0;
  std::vector<float> got(size_t(rows) * n_out);
  for (size_t i = 0; i < got.size(); ++i) {
    got[i] = bf16_to_float(y[i]);
    unwritten += !std::isfinite(got[i]);
  }
  for (size_t i = size_t(rows) * n_out; i < y.size(); ++i) touched += y[i] != 0xFFFF;
  EXPECT_EQ(unwritten, 0) << case_name(c) << ": outputs not written (or not finite)";
  EXPECT_EQ(touched, 0) << case_name(c) << ": rows past the last expert were written";
  if (rows == 0) return 0.0;
  const RowErrors e = compare_rows(got, ref, n_out, tol);
  EXPECT_EQ(e.bad_rows, 0) << case_name(c) << ": " << e.bad_rows << " of " << rows << " rows above " << tol
                           << "; worst row " << e.worst_row << " at " << e.worst;
  return e.worst;
}

// The case list both tests run: irregular M (0, 1, 7, 129, 1000), GLM-5 and tiny N/K,
// shapes off every tile multiple, all epilogues, both formats, and random top-8 routing.
inline std::vector<GemmCase> standard_cases(bool include_glm5) {
  std::vector<GemmCase> cases;
  const std::vector<int> irregular = {0, 1, 7, 129, 1000, 0, 3, 64};
  const std::vector<int> small_irregular = {0, 1, 7, 129, 0, 2, 33, 65, 0, 0, 1, 16};
  uint64_t seed = 100;
  for (WeightFormat f : {WeightFormat::NVFP4, WeightFormat::MXFP4})
    for (Epilogue e : {Epilogue::None, Epilogue::SiluMul, Epilogue::RowScale}) {
      cases.push_back({f, 256, 256, e, small_irregular, 5, seed++});  // tiny preset-like gate_up
      cases.push_back({f, 256, 128, e, small_irregular, 0, seed++});  // tiny down
      cases.push_back({f, 200, 96, e, {3, 0, 130, 1}, 2, seed++});    // N, K off the tiles
      if (f == WeightFormat::NVFP4) cases.push_back({f, 72, 48, e, {1, 64, 0, 9}, 0, seed++});
    }
  std::mt19937_64 rng(7);
  for (int t : {1, 8, 32, 128})
    cases.push_back({WeightFormat::NVFP4, 256, 256, Epilogue::SiluMul, random_routing_counts(t, 256, 8, rng), 0, seed++});
  if (include_glm5) {
    cases.push_back({WeightFormat::NVFP4, 4096, 6144, Epilogue::SiluMul, irregular, 3, seed++});  // gate_up
    cases.push_back({WeightFormat::NVFP4, 6144, 2048, Epilogue::RowScale, irregular, 0, seed++});  // down
    cases.push_back({WeightFormat::NVFP4, 6144, 2048, Epilogue::None, random_routing_counts(4, 32, 8, rng), 0, seed++});
    cases.push_back({WeightFormat::MXFP4, 4096, 6144, Epilogue::None, {0, 1, 7, 129}, 0, seed++});
    cases.push_back({WeightFormat::MXFP4, 6144, 2048, Epilogue::SiluMul, {5, 0, 40}, 0, seed++});
  }
  return cases;
}

}  // namespace fp4moe::test
