// cuda/sampling's sample() kernels (sample_f32_kernels.cuh: stats, mass, finish, with the launch
// shapes of sample()) run on the CPU through the CUDA emulator (tests/cuda/emu) against the CPU
// sampler cpu::sample_cpu, row by row. In the emulator logf / expf are the host's, so the
// kernels and cpu::sample_cpu compute the same floats: every row must give the same token, the
// same logprob and the same top-n, bit for bit — greedy, temperature, top-k / top-p / min-p and
// their mix, top_k 1 at a temperature, penalties from the token lists, logprobs, BF16-rounded
// logits with many ties, a row whose kept set overflows the candidate list (the whole-row
// selection), a done row; and a row sampled alone gives its batched token. On a GPU, logf / expf
// differ in the last ulp: tests/cuda/sampling_test and tests/backend/gpu_sampling_test allow a
// difference only where cpu::stable_draw fails (cpu/sampling_cpu.hpp derives the margin).
#define FP4MOE_CUDA_EMU 1
#include "cuda/emu/cuda_emu.hpp"
#pragma GCC diagnostic ignored "-Wsign-compare"  // nvcc code: int vs unsigned thread indices
#include "cuda/sampling/sample_f32_kernels.cuh"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "cpu/sampling_cpu.hpp"

namespace fp4moe::test {
namespace {

namespace sp = cuda::sampling;
using cpu::SamplingParams;

std::vector<float> random_logits(size_t n, uint64_t seed, float scale, bool bf16_ties) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) {
    x = d(g);
    if (bf16_ties) x = bf16_to_float(float_to_bf16(x));
  }
  return v;
}

// Row r's parameters: every mode of the scheme (r % 10), logprobs none / 0 / 5 / 20 (r % 4).
SamplingParams mixed(int r, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.seed = seed * 1000003 + uint64_t(r);
  switch (r % 10) {
    case 0: break;  // greedy
    case 1: p.temperature = 1.0f; break;
    case 2: p.temperature = 0.7f, p.top_k = 40; break;
    case 3: p.temperature = 1.0f, p.top_p = 0.9f; break;
    case 4: p.temperature = 1.2f, p.min_p = 0.05f; break;
    case 5: p.temperature = 0.8f, p.top_k = 200, p.top_p = 0.8f, p.min_p = 0.01f; break;
    case 6: p.temperature = 1.3f, p.top_k = 1; break;  // greedy by top_k
    case 7: p.temperature = 0.9f, p.repetition_penalty = 1.3f, p.frequency_penalty = 0.3f, p.presence_penalty = 0.5f; break;
    case 8: p.repetition_penalty = 0.8f, p.presence_penalty = -0.4f; break;  // greedy with penalties
    case 9: p.temperature = 0.6f, p.top_p = 0.95f, p.presence_penalty = 1.0f; break;
  }
  p.logprobs_top_n = r % 4 == 0 ? -1 : (r % 4 == 1 ? 0 : (r % 4 == 2 ? 5 : 20));
  return p;
}

struct Batch {
  int32_t rows = 0, vocab = 0;
  int64_t stride = 0, hist_stride = 0;
  std::vector<float> logits;  // [rows, stride]
  std::vector<SamplingParams> params;
  std::vector<int32_t> draw, done, history, prompt_len, output_len;

  std::vector<int32_t> prompt(int r) const {
    const int32_t* h = history.data() + r * hist_stride;
    return {h, h + prompt_len[size_t(r)]};
  }
  std::vector<int32_t> output(int r) const {
    const int32_t* h = history.data() + r * hist_stride + prompt_len[size_t(r)];
    return {h, h + output_len[size_t(r)]};
  }
};

Batch make_batch(int rows, int vocab, uint64_t seed, bool ties) {
  Batch b;
  b.rows = rows, b.vocab = vocab, b.stride = vocab + 4, b.hist_stride = 24;
  b.logits = random_logits(size_t(rows) * size_t(b.stride), seed, 3.0f, ties);
  std::mt19937_64 g(seed + 1);
  for (int r = 0; r < rows; ++r) {
    b.params.push_back(mixed(r, seed));
    b.draw.push_back(int32_t(g() % 1000));
    b.done.push_back(0);
    const int np = int(g() % 10), no = int(g() % 12);
    b.prompt_len.push_back(np);
    b.output_len.push_back(no);
    for (int j = 0; j < b.hist_stride; ++j) b.history.push_back(int32_t(g() % uint64_t(vocab)));
  }
  return b;
}

struct Result {
  std::vector<int32_t> tokens, top_ids;
  std::vector<float> logprob, top_lp;
};

// sample()'s three launches (sample_f32.cu) in the emulator, over a copy of the logits (the
// kernels apply penalties in place).
Result run_emulated(const Batch& b) {
  std::vector<float> logits = b.logits;
  size_t bytes = 0;
  sp::carve(nullptr, b.rows, b.vocab, &bytes);
  std::vector<unsigned char> ws_mem(bytes, 0xA5);
  const sp::Workspace ws = sp::carve(ws_mem.data(), b.rows, b.vocab, nullptr);
  Result out;
  out.tokens.assign(size_t(b.rows), 0x7eadbeef);
  out.logprob.assign(size_t(b.rows), -999.0f);
  out.top_ids.assign(size_t(b.rows) * cpu::kMaxTopLogprobs, 0x7eadbeef);
  out.top_lp.assign(size_t(b.rows) * cpu::kMaxTopLogprobs, -999.0f);
  sp::SampleArgs a;
  a.logits = logits.data();
  a.logits_stride = b.stride;
  a.rows = b.rows;
  a.vocab = b.vocab;
  a.params = b.params.data();
  a.draw_index = b.draw.data();
  a.done = b.done.data();
  a.history = b.history.data();
  a.history_stride = b.hist_stride;
  a.prompt_len = b.prompt_len.data();
  a.output_len = b.output_len.data();
  a.tokens = out.tokens.data();
  a.logprob = out.logprob.data();
  a.top_ids = out.top_ids.data();
  a.top_logprobs = out.top_lp.data();
  const sp::Geometry g = sp::geometry(b.rows, b.vocab);
  const bool vec = reinterpret_cast<uintptr_t>(a.logits) % 16 == 0 && a.logits_stride % 4 == 0;
  const dim3 grid(unsigned(g.chunks), unsigned(b.rows)), block(sp::detail::kThreads);
  emu::launch(grid, block, 0, sp::stats_kernel, a, ws, g, vec);
  emu::launch(grid, block, 0, sp::mass_kernel, a, ws, g, vec);
  emu::launch(grid, block, 0, sp::finish_kernel, a, ws, g, vec);
  return out;
}

// Every row against cpu::sample_cpu, exactly; returns how many rows drew (not greedy).
int expect_rows_equal_cpu(const Batch& b, const Result& got, const std::string& what) {
  int drawn = 0;
  for (int r = 0; r < b.rows; ++r) {
    const size_t R = size_t(r);
    const std::string where = what + " row " + std::to_string(r);
    if (b.done[R]) {
      EXPECT_EQ(got.tokens[R], cpu::kNoToken) << where;
      continue;
    }
    const auto ref = cpu::sample_cpu(b.logits.data() + R * size_t(b.stride), b.vocab, b.params[R], b.prompt(r),
                                     b.output(r), uint64_t(b.draw[R]));
    drawn += !b.params[R].greedy();
    EXPECT_EQ(got.tokens[R], ref.token) << where << " (draw margin " << ref.draw_margin << ", cut margin "
                                        << ref.cut_margin << ", kept " << ref.kept << ")";
    const int n = b.params[R].logprobs_top_n;
    if (n < 0) continue;
    EXPECT_EQ(got.logprob[R], ref.logprob) << where;
    for (int j = 0; j < cpu::kMaxTopLogprobs; ++j) {
      const size_t at = R * cpu::kMaxTopLogprobs + size_t(j);
      if (j < int(ref.top.size())) {
        EXPECT_EQ(got.top_ids[at], ref.top[size_t(j)].first) << where << " top " << j;
        EXPECT_EQ(got.top_lp[at], ref.top[size_t(j)].second) << where << " top " << j;
      } else {
        EXPECT_EQ(got.top_ids[at], cpu::kNoToken) << where << " top " << j << " (padding)";
      }
    }
  }
  return drawn;
}

TEST(SamplingEmu, EveryModeEqualsTheCpuSamplerBitForBit) {
  for (bool ties : {false, true}) {
    // 3,000 tokens: two chunks per row (the gather + last-CTA path); 10 rows: every mode once.
    Batch b = make_batch(10, 3000, ties ? 7 : 3, ties);
    b.done[4] = 1;  // a finished row writes kNoToken and nothing else
    const Result got = run_emulated(b);
    EXPECT_GE(expect_rows_equal_cpu(b, got, ties ? "bf16 ties" : "random"), 5);
  }
}

TEST(SamplingEmu, OneRowOverManyChunksAndTheWholeRowSelection) {
  // One row of 9,000 tokens: 8 chunks; a kept set larger than the 4,096-entry candidate list
  // (top_k 5,000; a high temperature with top-p 0.99) takes the one-CTA whole-row selection.
  for (int mode = 0; mode < 3; ++mode) {
    Batch b = make_batch(1, 9000, 40 + uint64_t(mode), false);
    SamplingParams& p = b.params[0];
    p = SamplingParams{};
    p.seed = 99 + uint64_t(mode);
    if (mode == 0) p.top_k = 5000, p.min_p = 0.0001f, p.logprobs_top_n = 3;
    if (mode == 1) p.temperature = 5.0f, p.top_p = 0.99f;
    if (mode == 2) p.temperature = 0.5f, p.logprobs_top_n = 20;  // plain draw over 8 chunks + logprobs
    const Result got = run_emulated(b);
    expect_rows_equal_cpu(b, got, "mode " + std::to_string(mode));
  }
}

TEST(SamplingEmu, ARowAloneDrawsItsBatchedToken) {
  const Batch b = make_batch(10, 2500, 11, false);
  const Result batched = run_emulated(b);
  for (int r : {1, 3, 5, 9}) {
    Batch one;
    one.rows = 1, one.vocab = b.vocab, one.stride = b.stride, one.hist_stride = b.hist_stride;
    one.logits.assign(b.logits.begin() + r * b.stride, b.logits.begin() + (r + 1) * b.stride);
    one.params = {b.params[size_t(r)]};
    one.draw = {b.draw[size_t(r)]};
    one.done = {0};
    one.prompt_len = {b.prompt_len[size_t(r)]};
    one.output_len = {b.output_len[size_t(r)]};
    one.history.assign(b.history.begin() + r * b.hist_stride, b.history.begin() + (r + 1) * b.hist_stride);
    const Result alone = run_emulated(one);
    EXPECT_EQ(alone.tokens[0], batched.tokens[size_t(r)]) << "row " << r;
  }
}

}  // namespace
}  // namespace fp4moe::test
