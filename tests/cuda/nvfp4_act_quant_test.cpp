// The Blackwell path's activation quantizer and row pass (cuda/moe_gemm_sm1xx/nvfp4_act_quant.cu)
// on any GPU (plain CUDA; the H200 runs it), against format/fp4.cpp's quantize_nvfp4 row by row:
// every code and every scale factor, read back through the 128x4-atom layout, grouped and slab
// layouts, an expert with no rows, rows outside the call's experts untouched (poisoned).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.hpp"
#include "cuda/moe_gemm_sm1xx/nvfp4_act_quant.hpp"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_layout.hpp"
#include "cuda/moe_test_util.hpp"
#include "gpu_test.hpp"
#include "format/codecs.hpp"
#include "format/fp4.hpp"

namespace fp4moe::test {
namespace {

using namespace cuda::sm1xx;

struct Batch {
  int k = 256;
  std::vector<int32_t> off = {0, 5, 5, 133, 140, 141};  // 5 experts: 5, 0, 128, 7, 1 rows
  int rows() const { return off.back(); }
  int experts() const { return int(off.size()) - 1; }
};

std::vector<uint16_t> bf16_rows(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
  return b;
}

// Quantizes rows of x (BF16 values as float) with global g as the CPU does, and checks the
// device's codes / scale factors of expert rows [off[b], off[e]) at their layout positions.
void expect_rows_match(const Batch& bt, const std::vector<float>& xf, float g, int e_begin, int e_end, int max_n,
                       const std::vector<uint8_t>& fp4, const std::vector<uint8_t>& sf) {
  const int k = bt.k;
  for (int e = e_begin; e < e_end; ++e)
    for (int r = bt.off[size_t(e)]; r < bt.off[size_t(e) + 1]; ++r) {
      const int local = r - bt.off[size_t(e)];
      const Fp4Matrix ref = quantize_nvfp4(xf.data() + size_t(r) * k, 1, k, g);
      const int64_t out_row = max_n ? slab_row(e - e_begin, local, max_n) : r;
      const int64_t sf_row = max_n ? slab_sf_row(e - e_begin, local, max_n) : act_sf_row_base(e, bt.off[size_t(e)]) + local;
      for (int j = 0; j < k / 2; ++j)
        ASSERT_EQ(fp4[size_t(out_row * (k / 2) + j)], ref.packed[size_t(j)]) << "expert " << e << " row " << r << " byte " << j;
      for (int kb = 0; kb < k / 16; ++kb)
        ASSERT_EQ(sf[size_t(sf_offset(sf_row, kb, k))], ref.scales[size_t(kb)]) << "expert " << e << " row " << r << " kb " << kb;
    }
}

void run_quant(const Batch& bt, int e_begin, int e_end, int max_n, bool silu, uint64_t seed) {
  const int k = bt.k, rows = bt.rows(), cols = silu ? 2 * k : k;
  std::vector<float> xf = random_floats(size_t(rows) * cols, seed, -3.f, 3.f);
  for (size_t i = 0; i < xf.size(); i += 97) xf[i] = 0.0f;  // zeros, and one all-zero block
  for (int i = 0; i < 16; ++i) xf[size_t(7 * cols + 32 + i)] = 0.0f;
  for (float& v : xf) v = round_to_bf16(v);
  std::vector<float> q = xf;  // what gets quantized: x, or SiLU(gate)·up rounded to BF16
  if (silu) {
    q.assign(size_t(rows) * k, 0.f);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < k; ++j) {
        const float gt = xf[size_t(r * cols + j)], up = xf[size_t(r * cols + k + j)];
        q[size_t(r * k + j)] = round_to_bf16(gt / (1.0f + std::exp(-gt)) * up);
      }
  }
  const float g = nvfp4_global_scale_from_amax(2.5f);  // values beyond amax saturate at 6
  const int groups = e_end - e_begin;
  const int64_t out_rows = max_n ? int64_t(groups) * max_n : rows;
  const int64_t sf_rows_n = max_n ? int64_t(groups) * sf_rows(max_n) : act_sf_rows_bound(rows, bt.experts());
  DeviceArray<uint16_t> x(bf16_rows(xf));
  DeviceArray<int32_t> off(bt.off);
  DeviceArray<float> dg(std::vector<float>{g});
  DeviceArray<uint8_t> fp4(size_t(out_rows * k / 2)), sf(size_t(sf_rows_n * sf_cols(k)));
  ActQuantArgs a;
  a.x = x.ptr;
  a.rows = rows;
  a.k = k;
  a.offsets = off.ptr;
  a.expert_begin = e_begin;
  a.expert_end = e_end;
  a.global = dg.ptr;
  a.out_fp4 = fp4.ptr;
  a.out_sf = sf.ptr;
  a.max_n = max_n;
  a.silu_mul = silu;
  quantize_act_nvfp4(a, nullptr);
  const std::vector<uint8_t> hf = fp4.download(), hs = sf.download();
  if (!silu) {
    expect_rows_match(bt, q, g, e_begin, e_end, max_n, hf, hs);
  } else {
    // expf on the device vs std::exp here may differ by an ulp before the BF16 rounding: the
    // dequantized values must then agree within half an E2M1 step of their block.
    int differing_blocks = 0, blocks = 0;
    for (int e = e_begin; e < e_end; ++e)
      for (int r = bt.off[size_t(e)]; r < bt.off[size_t(e) + 1]; ++r) {
        const int local = r - bt.off[size_t(e)];
        const int64_t out_row = max_n ? slab_row(e - e_begin, local, max_n) : r;
        const int64_t sf_row = max_n ? slab_sf_row(e - e_begin, local, max_n) : act_sf_row_base(e, bt.off[size_t(e)]) + local;
        const Fp4Matrix ref = quantize_nvfp4(q.data() + size_t(r) * k, 1, k, g);
        for (int kb = 0; kb < k / 16; ++kb) {
          const float s = e4m3_to_float(hs[size_t(sf_offset(sf_row, kb, k))]) * g;
          const float s_ref = e4m3_to_float(ref.scales[size_t(kb)]) * g;
          bool same = hs[size_t(sf_offset(sf_row, kb, k))] == ref.scales[size_t(kb)];
          for (int i = 0; i < 16; ++i) {
            const uint8_t byte = hf[size_t(out_row * (k / 2) + kb * 8 + i / 2)];
            const float v = e2m1_to_float(uint8_t(i % 2 ? byte >> 4 : byte & 0xF)) * s;
            const float want = q[size_t(r * k + kb * 16 + i)];
            ASSERT_LE(std::fabs(v - std::clamp(want, -6 * s_ref, 6 * s_ref)), 1.0f * std::max(s, s_ref) + std::fabs(want) * 0x1p-7f)
                << "expert " << e << " row " << r << " element " << kb * 16 + i;
            same &= (byte == ref.packed[size_t(kb * 8 + i / 2)]);
          }
          differing_blocks += !same;
          ++blocks;
        }
      }
    EXPECT_LE(differing_blocks, blocks / 100) << "blocks whose codes differ from the CPU's (expf ulps only)";
  }
}

TEST(Nvfp4ActQuant, GroupedLayoutMatchesTheCpuQuantizerEveryCodeAndScale) {
  FP4MOE_SKIP_WITHOUT_GPU();
  Batch bt;
  run_quant(bt, 0, bt.experts(), 0, false, 1);
  run_quant(bt, 2, 4, 0, false, 2);  // a sub-range of experts (offsets stay absolute)
  bt.k = 512;
  run_quant(bt, 0, bt.experts(), 0, false, 3);
}

TEST(Nvfp4ActQuant, SlabLayoutMatchesTheCpuQuantizer) {
  FP4MOE_SKIP_WITHOUT_GPU();
  Batch bt;
  bt.off = {0, 5, 5, 45, 52, 53};  // at most 40 rows per expert
  run_quant(bt, 0, bt.experts(), 40, false, 4);
  run_quant(bt, 1, 4, 40, false, 5);
}

TEST(Nvfp4ActQuant, SiluMulInputQuantizesSiluOfGateTimesUp) {
  FP4MOE_SKIP_WITHOUT_GPU();
  Batch bt;
  run_quant(bt, 0, bt.experts(), 0, true, 6);
}

TEST(Nvfp4RowPass, GathersSlabsScalesRowsAndAppliesSiluMul) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> off = {0, 3, 3, 10};
  const int n = 64, rows = 10, max_n = 8, groups = 3;
  for (bool silu : {false, true})
    for (bool slab : {false, true}) {
      const int src_cols = silu ? 2 * n : n;
      const int src_rows = slab ? groups * max_n : rows;
      std::vector<float> src = random_floats(size_t(src_rows) * src_cols, 40 + silu * 2 + slab, -2.f, 2.f);
      for (float& v : src) v = round_to_bf16(v);
      const std::vector<float> w = random_floats(rows, 50, 0.f, 1.f);
      DeviceArray<uint16_t> d_src(bf16_rows(src)), y(size_t(rows) * n);
      DeviceArray<int32_t> d_off(off);
      DeviceArray<float> d_w(w);
      RowGatherArgs a;
      a.src = d_src.ptr;
      a.y = y.ptr;
      a.rows = rows;
      a.n = n;
      a.offsets = d_off.ptr;
      a.expert_begin = 0;
      a.expert_end = groups;
      a.row_scale = d_w.ptr;
      a.max_n = slab ? max_n : 0;
      a.silu_mul = silu;
      gather_scale_rows_bf16(a, nullptr);
      const std::vector<uint16_t> got = y.download();
      for (int e = 0; e < groups; ++e)
        for (int r = off[size_t(e)]; r < off[size_t(e) + 1]; ++r) {
          const int64_t sr = slab ? slab_row(e, r - off[size_t(e)], max_n) : r;
          for (int j = 0; j < n; ++j) {
            float v = src[size_t(sr * src_cols + j)];
            if (silu) {
              const float up = src[size_t(sr * src_cols + n + j)];
              v = v / (1.0f + std::exp(-v)) * up;
              // SiLU via expf on the device: allow one BF16 ulp before the scaling.
              const float want = round_to_bf16(round_to_bf16(v) * w[size_t(r)]);
              ASSERT_NEAR(bf16_to_float(got[size_t(r * n + j)]), want, std::fabs(want) * 0x1p-6f + 1e-30f)
                  << "silu slab " << slab << " row " << r << " col " << j;
            } else {
              ASSERT_EQ(got[size_t(r * n + j)], float_to_bf16(v * w[size_t(r)])) << "slab " << slab << " row " << r;
            }
          }
        }
    }
}

}  // namespace
}  // namespace fp4moe::test
