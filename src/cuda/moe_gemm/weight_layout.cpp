// The sm90 kernels' device weights: FP4 experts (checkpoint layout: packed [E, N, K/2], scales
// [E, N, K/block], globals [E]; owned, or views of the mmap'd shards) re-laid into the chunks of
// sm90_tile_layout.hpp one 128-row tile at a time (weight_relayout.cpp) straight into pinned
// staging on several threads, the copies to the device overlapping the re-layout of the next
// tiles (cuda/common/staged_upload.hpp). No host copy of the stack is made.
#include <cmath>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/staged_upload.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"
#include "cuda/moe_gemm/weight_relayout.hpp"

namespace fp4moe::cuda {

using sm90::kBlockK;
using sm90::kBlockM;

DeviceExpertWeights DeviceExpertWeights::allocate(WeightFormat format, bool silu_layout, int num_experts, int n,
                                                  int k) {
  FP4MOE_CHECK(num_experts >= 1 && n > 0 && k > 0 && n % kBlockM == 0 && k % kBlockK == 0,
               "sm90 weights: [{}, {}, {}] is not a positive multiple of the [-, {}, {}] tile", num_experts, n, k,
               kBlockM, kBlockK);
  DeviceExpertWeights d;
  d.format = format;
  d.silu_layout = silu_layout;
  d.num_experts = num_experts;
  d.n = n;
  d.k = k;
  d.global_scale_host.assign(size_t(num_experts), 1.0f);
  const size_t tile_bytes = sm90::align_up(size_t(num_experts) * sm90::sm90_expert_tile_bytes(n, k), 256);
  d.storage_ = DeviceBuffer(tile_bytes + size_t(num_experts) * 4);
  d.tiles = d.storage_.as<uint8_t>();
  d.global_scale = reinterpret_cast<float*>(d.tiles + tile_bytes);
  return d;
}

size_t DeviceExpertWeights::bytes() const {
  return size_t(num_experts) * sm90::sm90_expert_tile_bytes(n, k) + size_t(num_experts) * 4;
}

DeviceExpertWeights upload_weights_concat(const std::vector<const ExpertStack*>& stacks, Epilogue epilogue,
                                          cudaStream_t stream, StagedUpload* staging) {
  FP4MOE_CHECK(!stacks.empty(), "sm90 upload: no expert stacks");
  for (const ExpertStack* s : stacks) FP4MOE_CHECK(s != nullptr, "sm90 upload: null expert stack");
  const ExpertStack& first = *stacks.front();
  int64_t E = 0;
  for (const ExpertStack* s : stacks) {
    FP4MOE_CHECK(s->format == first.format && s->n == first.n && s->k == first.k,
                 "sm90 upload: stacks differ ({} [{}, {}] vs {} [{}, {}])", weight_format_name(s->format), s->n, s->k,
                 weight_format_name(first.format), first.n, first.k);
    check_relayout_sm90(*s);
    E += s->num_experts;
  }
  const int64_t N = first.n, K = first.k, RT = N / kBlockM;
  const bool mx = first.format == WeightFormat::MXFP4;
  DeviceExpertWeights d = DeviceExpertWeights::allocate(first.format, epilogue == Epilogue::SiluMul, int(E), int(N),
                                                        int(K));
  const size_t per_expert = sm90::sm90_expert_tile_bytes(int(N), int(K)), tile = sm90_row_tile_bytes(K);
  std::optional<StagedUpload> own;
  StagedUpload& up = staging ? *staging : own.emplace();
  int64_t e0 = 0;
  for (const ExpertStack* s : stacks) {
    std::vector<Fp4ExpertRows> rows;  // once per expert, read by every tile's item
    rows.reserve(size_t(s->num_experts));
    for (int64_t e = 0; e < s->num_experts; ++e) {
      rows.emplace_back(*s, e);
      if (mx) continue;
      const float g = rows.back().global_scale();
      FP4MOE_CHECK(std::isfinite(g), "sm90 upload: expert {} global scale is not finite", e0 + e);
      d.global_scale_host[size_t(e0 + e)] = g;
    }
    // Items: (expert, 128-row tile), in device order.
    up.upload_items(d.tiles + size_t(e0) * per_expert, tile, s->num_experts * RT, [&](int64_t i, uint8_t* out) {
      const int64_t e = i / RT;
      relayout_row_tile_sm90(rows[size_t(e)], s->format, N, K, i % RT, epilogue, e0 + e, out);
    });
    e0 += s->num_experts;
  }
  up.finish();
  FP4MOE_CUDA_CHECK(
      cudaMemcpyAsync(d.global_scale, d.global_scale_host.data(), size_t(E) * 4, cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

DeviceExpertWeights upload_weights(const ExpertStack& w, Epilogue epilogue, cudaStream_t stream) {
  return upload_weights_concat({&w}, epilogue, stream);
}

}  // namespace fp4moe::cuda
