// GpuRunner's device sampling (cuda/sampling's sample()): the per-row parameters, draw indices
// and penalty token lists go up in one or two host→device copies; only tokens (and logprobs when
// a row asks) come back. The buffers are planned with the workspace (plan_memory: sample()'s
// workspace, the rows' block, the results of K steps, the histories, the grammar masks); their
// pinned mirrors here. Grammar masks (constrained decoding): the step's masked rows' bitmasks
// go up packed with a slot per logits row in one copy, and forward() applies them right after
// the lm_head (cuda/sampling/token_bitmask_f32), before the argmax and sample().
#include <algorithm>

#include "core/error.hpp"
#include "core/sampling_params.hpp"
#include "cuda/common/cuda_check.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"

namespace fp4moe::engine::gpu {

namespace sp = cuda::sampling;
using cpu::kMaxTopLogprobs;
using cpu::SamplingParams;

namespace {
constexpr size_t kRowInBytes = sizeof(SamplingParams) + 4 * sizeof(int32_t);  // params, 4 ints
static_assert(sizeof(SamplingParams) % 8 == 0);
}  // namespace

size_t GpuRunner::Impl::sample_in_bytes(int64_t rows) { return size_t(rows) * kRowInBytes; }

size_t GpuRunner::Impl::sample_out_ints(int64_t steps, int64_t rows) {
  return size_t(steps * rows) * (2 + 2 * kMaxTopLogprobs);
}

size_t GpuRunner::Impl::token_mask_bytes(int64_t logits_rows, int64_t rows, int64_t vocab) {
  return size_t(logits_rows + rows * cuda::sampling::token_mask_words(vocab)) * 4;
}

void GpuRunner::Impl::plan_sampling() {
  sample_in_host.alloc(sample_in_bytes(sample_rows) / 4);
  sample_out_host.alloc(sample_out_ints(sample_steps, sample_rows));
  sample_hist_host.alloc(size_t(sample_hist_ints));
  token_mask_host.alloc(token_mask_bytes(logits_rows, sample_rows, cfg.vocab) / 4);
  FP4MOE_CUDA_CHECK(cudaMemset(s.token_masks, 0xFF, size_t(logits_rows) * 4));  // every slot -1
  token_masks_set = false;
}

void GpuRunner::Impl::upload_token_masks(std::span<const uint32_t* const> masks) {
  const bool any = std::any_of(masks.begin(), masks.end(), [](const uint32_t* m) { return m != nullptr; });
  if (!any) {
    if (token_masks_set) FP4MOE_CUDA_CHECK(cudaMemsetAsync(s.token_masks, 0xFF, size_t(logits_rows) * 4, stream));
    token_masks_set = false;
    return;
  }
  FP4MOE_CHECK(int64_t(masks.size()) <= logits_rows, "token masks for {} logits rows, the runner has {}", masks.size(),
               logits_rows);
  const int64_t W = cuda::sampling::token_mask_words(cfg.vocab);
  int32_t* slot = token_mask_host.p;
  auto* packed = reinterpret_cast<uint32_t*>(slot + logits_rows);
  std::fill(slot + masks.size(), slot + logits_rows, -1);  // padding rows of a graph bucket too
  const int64_t n = pack_token_masks(masks, W, sample_rows, slot, packed);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.token_masks, slot, size_t(logits_rows + n * W) * 4, cudaMemcpyHostToDevice,
                                    stream));
  token_masks_set = true;
}

void GpuRunner::Impl::apply_token_masks(int rows) {
  const auto* slot = reinterpret_cast<const int32_t*>(s.token_masks);
  apply_token_bitmask_f32(s.logits, cfg.vocab, rows, int(cfg.vocab), slot,
                          reinterpret_cast<const uint32_t*>(slot + logits_rows),
                          cuda::sampling::token_mask_words(cfg.vocab), stream);
}

SampleLaunch GpuRunner::Impl::upload_sampling(std::span<const RowSampling> rows, int64_t extra) {
  const int64_t n = int64_t(rows.size());
  FP4MOE_CHECK(n >= 1 && n <= sample_rows, "device sampling of {} rows: the runner samples 1 .. {} (max_requests)", n,
               sample_rows);
  for (const RowSampling& r : rows) cpu::validate_sampling(r.params);
  const int64_t stride = history_stride(rows, extra);
  FP4MOE_CHECK(stride * n <= sample_hist_ints,
               "device sampling: penalty token lists of {} rows x {} ids, room for {} (max_context + max_decode_steps "
               "per request)",
               n, stride, sample_hist_ints);
  uint8_t* h = reinterpret_cast<uint8_t*>(sample_in_host.p);
  auto* params = reinterpret_cast<SamplingParams*>(h);
  int32_t* ints = reinterpret_cast<int32_t*>(h + size_t(n) * sizeof(SamplingParams));
  bool logprobs = false;
  for (int64_t r = 0; r < n; ++r) {
    params[r] = rows[size_t(r)].params;
    logprobs = logprobs || params[r].logprobs_top_n >= 0;
  }
  pack_sampling_rows(rows, stride, ints, ints + n, ints + 2 * n, sample_hist_host.p);
  std::fill(ints + 3 * n, ints + 4 * n, 0);  // done
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.sample_in, h, size_t(n) * kRowInBytes, cudaMemcpyHostToDevice, stream));
  if (stride > 0)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.sample_hist, sample_hist_host.p, size_t(n * stride) * 4,
                                      cudaMemcpyHostToDevice, stream));
  SampleLaunch L;
  L.n = n;
  L.logprobs = logprobs;
  int32_t* d = reinterpret_cast<int32_t*>(s.sample_in + size_t(n) * sizeof(SamplingParams));
  L.prompt_len = d;
  L.output_len = d + n;
  L.draw = d + 2 * n;
  L.done = d + 3 * n;
  L.history_stride = stride;
  sp::SampleArgs& a = L.args;
  a.logits_stride = cfg.vocab;
  a.rows = int32_t(n);
  a.vocab = int32_t(cfg.vocab);
  a.params = reinterpret_cast<const SamplingParams*>(s.sample_in);
  a.draw_index = L.draw;
  a.done = L.done;
  if (stride > 0) {
    a.history = s.sample_hist;
    a.history_stride = stride;
    a.prompt_len = L.prompt_len;
    a.output_len = L.output_len;
  }
  return L;
}

void GpuRunner::Impl::run_sample(const SampleLaunch& L, float* logits, int64_t j) {
  FP4MOE_CHECK(j >= 0 && j < sample_steps, "device sampling: step {} of {}", j, sample_steps);
  sp::SampleArgs a = L.args;
  a.logits = logits;
  const int64_t KS = sample_steps * sample_rows, n = L.n;
  int32_t* o = s.sample_out;
  a.tokens = o + j * n;
  if (L.logprobs) {
    a.logprob = reinterpret_cast<float*>(o + KS) + j * n;
    a.top_ids = o + 2 * KS + j * n * kMaxTopLogprobs;
    a.top_logprobs = reinterpret_cast<float*>(o + (2 + kMaxTopLogprobs) * KS) + j * n * kMaxTopLogprobs;
  }
  sp::sample(a, s.sample_ws, s.sample_ws_bytes, stream);
}

void GpuRunner::Impl::read_sampled(const SampleLaunch& L, int64_t K) {
  const int64_t KS = sample_steps * sample_rows, m = K * L.n;
  int32_t* h = sample_out_host.p;
  const int32_t* o = s.sample_out;
  auto copy = [&](int64_t host_at, int64_t dev_at, int64_t count) {
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(h + host_at, o + dev_at, size_t(count) * 4, cudaMemcpyDeviceToHost, stream));
  };
  copy(0, 0, m);
  if (!L.logprobs) return;
  copy(m, KS, m);
  copy(2 * m, 2 * KS, m * kMaxTopLogprobs);
  copy((2 + kMaxTopLogprobs) * m, (2 + kMaxTopLogprobs) * KS, m * kMaxTopLogprobs);
}

GeneratedToken GpuRunner::Impl::sampled_token(const SampleLaunch& L, int64_t K, int64_t j, int64_t r) const {
  const int64_t m = K * L.n, i = j * L.n + r;
  const int32_t* h = sample_out_host.p;
  GeneratedToken t;
  t.id = h[i];
  const int top_n = reinterpret_cast<const SamplingParams*>(sample_in_host.p)[r].logprobs_top_n;
  if (top_n < 0 || t.id == cpu::kNoToken) return t;
  t.logprob = reinterpret_cast<const float*>(h + m)[i];
  const int32_t* ids = h + 2 * m + i * kMaxTopLogprobs;
  const float* lps = reinterpret_cast<const float*>(h + (2 + kMaxTopLogprobs) * m) + i * kMaxTopLogprobs;
  for (int q = 0; q < top_n && q < kMaxTopLogprobs && ids[q] != cpu::kNoToken; ++q) t.top.push_back({ids[q], lps[q]});
  return t;
}

}  // namespace fp4moe::engine::gpu
