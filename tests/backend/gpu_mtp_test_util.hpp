// The MTP layer on the GPU against the CPU's on the same inputs, shared by gpu_speculative_test
// (BF16 experts) and gpu_mtp_quantized_test (the experts quantized to NVFP4 on both sides): the
// CPU target over a prompt gives every position's state after the final norm (rounded to BF16,
// the GPU's h_in precision, on both sides), then the MTP step over (h_i, t_{i+1}), i = 0 .. P - 2,
// runs on both. Bound (the runner tests'): rel L2 <= 5e-2 per row (BF16 activations), greedy equal
// where the CPU's top-2 margin > kMtpMargin; a row whose MTP block routing or top-k tips on a near
// tie differs by O(1) (2 of 64 tokens measured on glm5-tiny-sparse), so up to 10 % of the rows may
// exceed the bound.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/gpu_runner.hpp"
#include "backend/gpu_runner_test_util.hpp"
#include "model/model.hpp"
#include "model/model_test_util.hpp"

namespace fp4moe::testing_gpu_mtp {

inline constexpr float kMtpMargin = 1e-2f;

inline float bf16_round(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// The MTP logits / states of the P - 1 prompt pairs: lc / hc the CPU's, lg / hg the GPU's.
struct MtpRows {
  int64_t T = 0, V = 0, H = 0;
  std::vector<float> lc, hc, lg, hg;
};

inline MtpRows mtp_rows(model::Model& cpu, engine::gpu::GpuRunner& gpu, int64_t P, uint32_t prompt_seed) {
  const model::MlaModelConfig& c = cpu.config();
  MtpRows m;
  m.V = c.vocab;
  m.H = c.hidden;
  m.T = P - 1;
  const int64_t V = m.V, H = m.H, T = m.T;
  const std::vector<int32_t> prompt = testing_gpu_runner::prompt_of(P, V, prompt_seed);
  model::HostKvPool kv(cpu.mtp_kv_geometry(gpu.page_size(), 8, KvElem::BF16), cpu.mtp_kv_index_layers());
  std::vector<int32_t> cpages{0, 1, 2, 3}, pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = int32_t(i);
  const int32_t qo[2] = {0, int32_t(P)}, len[1] = {int32_t(P)}, pp[2] = {0, 4};
  std::vector<float> hidden(size_t(P * H)), none;
  model::StepExtras x;
  x.final_hidden = hidden.data();
  cpu.step(TensorView::of(prompt.data(), {P}), {1, P, qo, pos.data(), len, pp, cpages.data()}, kv, {},
           TensorView::of(none.data(), {0, V}), nullptr, x);
  for (float& f : hidden) f = bf16_round(f);
  const int32_t mqo[2] = {0, int32_t(T)}, mlen[1] = {int32_t(T)};
  std::vector<int32_t> rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) rows[size_t(i)] = int32_t(i);
  m.lc.resize(size_t(T * V));
  m.hc.resize(size_t(T * H));
  cpu.mtp_step(TensorView::of(prompt.data() + 1, {T}), hidden.data(), {1, T, mqo, pos.data(), mlen, pp, cpages.data()},
               kv, rows, TensorView::of(m.lc.data(), {T, V}), m.hc.data());
  const std::vector<int32_t> gpages = gpu.alloc_pages(4);
  const int32_t gpp[2] = {0, 4};
  engine::gpu::MtpStepInput in;
  in.tokens = prompt.data() + 1;
  in.h_in = hidden.data();
  in.batch = {1, T, mqo, pos.data(), mlen, gpp, gpages.data()};
  in.logits_rows = rows;
  gpu.mtp_step(in, {&m.lg, &m.hg});
  gpu.release_pages(gpages);
  return m;
}

// The bound above over every row; `label` names the run in the printed lines.
inline void expect_mtp_rows_match(const MtpRows& m, const std::string& label) {
  const int64_t T = m.T, V = m.V;
  ASSERT_EQ(m.lg.size(), m.lc.size());
  ASSERT_EQ(m.hg.size(), m.hc.size());
  int64_t over = 0, compared = 0;
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t v = 0; v < V; ++v) ASSERT_TRUE(std::isfinite(m.lg[size_t(i * V + v)])) << "row " << i;
    const double e = testing_model::rel_l2(m.lg.data() + i * V, m.lc.data() + i * V, size_t(V));
    if (e > 5e-2) {
      ++over;
      std::printf("[ info ] %s: MTP row %ld rel L2 %.3f (a near tie in the MTP block's routing / top-k?)\n",
                  label.c_str(), long(i), e);
      continue;
    }
    if (testing_model::top2_margin(m.lc.data() + i * V, V) <= kMtpMargin) continue;
    ++compared;
    EXPECT_EQ(testing_model::argmax(m.lg.data() + i * V, V), testing_model::argmax(m.lc.data() + i * V, V))
        << "row " << i;
  }
  std::printf("[ info ] %s: MTP logits rel L2 %.3e, MTP hidden rel L2 %.3e, %ld of %ld rows over 5e-2, greedy "
              "compared on %ld\n",
              label.c_str(), testing_model::rel_l2(m.lg.data(), m.lc.data(), m.lc.size()),
              testing_model::rel_l2(m.hg.data(), m.hc.data(), m.hc.size()), long(over), long(T), long(compared));
  EXPECT_LE(over, T / 10) << "rows over the bound";
  EXPECT_GT(compared, T / 2) << "too few rows with a clear greedy token";
}

}  // namespace fp4moe::testing_gpu_mtp
