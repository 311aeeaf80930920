// Re-layout of FP4 expert weights (checkpoint layout: packed [E, N, K/2], scales
// [E, N, K/block], globals [E]) into the sm90 kernel's chunks (sm90_tile_layout.hpp), on the
// host (parallel over 128-row tiles), then one upload. Load-time work: the kernel then reads
// each thread's codes for 4 K steps with one 16-byte shared load, and its scales with one
// 8-byte broadcast load.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "format/codecs.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"
#include "cuda/moe_gemm/sm90_fp4_word.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"

namespace fp4moe::cuda {

using sm90::kBlockK;
using sm90::kBlockM;
using sm90::kChunkBytes;
using sm90::kCodeBytes;

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

namespace {

// Logical weight row of fragment row h (0: r0 = g, 1: r1 = g + 8) of (warpgroup, warp, g).
inline int64_t logical_row(bool silu, int64_t n, int64_t rt, int cw, int warp, int g, int h) {
  if (silu) {
    const int64_t f = 64 * rt + 32 * cw + 8 * warp + g;
    return h == 0 ? f : n / 2 + f;
  }
  return kBlockM * rt + 64 * cw + 16 * warp + 2 * g + h;
}

// |E4M3 scale| byte (0..0x7E) -> the chunk's scale byte c with bf16(scale * 2^119) =
// c * 16 + 0x7000 (sm90_tile_layout.hpp); 0 for a zero scale (its codes are zeroed).
uint8_t nvfp4_scale_byte(uint8_t e4m3) {
  if (e4m3 == 0) return 0;
  const float v = std::ldexp(e4m3_to_float(e4m3), 119);
  uint32_t fb;
  std::memcpy(&fb, &v, 4);
  const uint32_t bf = fb >> 16;
  FP4MOE_CHECK((fb & 0xFFFFu) == 0 && (bf & 0xFu) == 0 && bf >= sm90::kScaleAddNvfp4 &&
                   bf - sm90::kScaleAddNvfp4 <= 255u * sm90::kScaleMulNvfp4,
               "sm90 upload: E4M3 scale byte {:#x} has no chunk encoding", e4m3);
  return uint8_t((bf - sm90::kScaleAddNvfp4) / sm90::kScaleMulNvfp4);
}

}  // namespace

std::vector<uint8_t> relayout_weights_sm90(const ExpertStack& w, Epilogue epilogue) {
  FP4MOE_CHECK(w.is_fp4(), "sm90 upload: weights are {}, the sm90 kernel takes NVFP4 or MXFP4",
               weight_format_name(w.format));
  const int64_t E = w.num_experts, N = w.n, K = w.k;
  FP4MOE_CHECK(E > 0 && N > 0 && K > 0, "sm90 upload: empty expert stack [{}, {}, {}]", E, N, K);
  FP4MOE_CHECK(N % kBlockM == 0, "sm90 upload: N = {} is not a multiple of {}", N, kBlockM);
  FP4MOE_CHECK(K % kBlockK == 0, "sm90 upload: K = {} is not a multiple of {}", K, kBlockK);
  const bool mx = w.format == WeightFormat::MXFP4;
  const int64_t block = w.block();
  FP4MOE_CHECK(w.packed.size() == size_t(E * N * K / 2) && w.scales.size() == size_t(E * N * (K / block)) &&
                   (mx || w.global_scale.size() == size_t(E)),
               "sm90 upload: expert stack buffers do not match [{}, {}, {}]", E, N, K);
  const bool silu = epilogue == Epilogue::SiluMul;
  const int64_t RT = N / kBlockM, KT = K / kBlockK;

  std::vector<uint8_t> host(size_t(E * RT * KT) * kChunkBytes);
  parallel_for(E * RT, default_num_threads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t et = begin; et < end; ++et) {
      const int64_t e = et / RT, rt = et % RT;
      const uint8_t* packed = w.packed.data() + size_t(e * N * (K / 2));
      const uint8_t* scales = w.scales.data() + size_t(e * N * (K / block));
      for (int64_t kt = 0; kt < KT; ++kt) {
        uint8_t* chunk = host.data() + size_t((et * KT + kt) * kChunkBytes);
        for (int cw = 0; cw < 2; ++cw)
          for (int warp = 0; warp < 4; ++warp)
            for (int lane = 0; lane < 32; ++lane) {
              const int g = lane / 4, t = lane % 4;
              const int64_t rows[2] = {logical_row(silu, N, rt, cw, warp, g, 0),
                                       logical_row(silu, N, rt, cw, warp, g, 1)};
              for (int ks = 0; ks < 4; ++ks) {
                const int64_t kb = kt * kBlockK + ks * 16;
                uint8_t sbyte[2];
                uint8_t flip[2];
                bool zero[2];
                for (int h = 0; h < 2; ++h) {
                  uint8_t s = scales[size_t(rows[h] * (K / block) + kb / block)];
                  flip[h] = 0;
                  zero[h] = false;
                  if (mx) {
                    FP4MOE_CHECK(s >= 9 && s <= 135,
                                 "sm90 upload: MXFP4 scale 2^{} (expert {}, row {}) is outside the supported "
                                 "[2^-118, 2^8]",
                                 int(s) - 127, e, rows[h]);
                  } else {
                    FP4MOE_CHECK((s & 0x7F) != 0x7F, "sm90 upload: NaN E4M3 scale (expert {}, row {}, k {})", e,
                                 rows[h], kb);
                    if (s & 0x80) flip[h] = 8;  // negative scale: fold the sign into the codes
                    s &= 0x7F;
                    zero[h] = s == 0;           // zero scale: zero codes (value 0 either way)
                    s = nvfp4_scale_byte(s);
                  }
                  sbyte[h] = s;
                }
                uint8_t* sdst = chunk + kCodeBytes + ((cw * 4 + warp) * 8 + g) * 8 + ks * 2;
                if (lane % 4 == 0) {
                  sdst[0] = sbyte[0];
                  sdst[1] = sbyte[1];
                }
                uint8_t codes[4][2];  // [fragment register][column, column + 1]
                for (int j = 0; j < 4; ++j) {
                  const int h = j & 1;
                  const int64_t col = kb + 2 * t + (j >= 2 ? 8 : 0);
                  const uint8_t byte = packed[size_t(rows[h] * (K / 2) + col / 2)];  // col even: lo, hi
                  uint8_t lo = byte & 0xF, hi = byte >> 4;
                  if (zero[h]) lo = hi = 0;
                  codes[j][0] = uint8_t(lo ^ flip[h]);
                  codes[j][1] = uint8_t(hi ^ flip[h]);
                }
                const uint32_t word = sm90::fp4_pack_word(codes);
                std::memcpy(chunk + (cw * 128 + warp * 32 + lane) * 16 + ks * 4, &word, 4);
              }
            }
      }
    }
  });

  return host;
}

DeviceExpertWeights upload_weights_concat(const std::vector<const ExpertStack*>& stacks, Epilogue epilogue,
                                          cudaStream_t stream) {
  FP4MOE_CHECK(!stacks.empty(), "sm90 upload: no expert stacks");
  for (const ExpertStack* s : stacks) FP4MOE_CHECK(s != nullptr, "sm90 upload: null expert stack");
  const ExpertStack& first = *stacks.front();
  int64_t E = 0;
  for (const ExpertStack* s : stacks) {
    FP4MOE_CHECK(s->format == first.format && s->n == first.n && s->k == first.k,
                 "sm90 upload: stacks differ ({} [{}, {}] vs {} [{}, {}])", weight_format_name(s->format), s->n, s->k,
                 weight_format_name(first.format), first.n, first.k);
    E += s->num_experts;
  }
  const int64_t N = first.n, K = first.k;
  const bool mx = first.format == WeightFormat::MXFP4;
  FP4MOE_CHECK(first.is_fp4(), "sm90 upload: FP4 weights needed, got {}", weight_format_name(first.format));
  FP4MOE_CHECK(N % kBlockM == 0 && K % kBlockK == 0 && N > 0 && K > 0,
               "sm90 upload: [{}, {}] is not a positive multiple of the {} x {} tile", N, K, kBlockM, kBlockK);
  DeviceExpertWeights d = DeviceExpertWeights::allocate(first.format, epilogue == Epilogue::SiluMul, int(E), int(N),
                                                        int(K));
  const size_t per_expert = sm90::sm90_expert_tile_bytes(int(N), int(K));
  int64_t e0 = 0;
  for (const ExpertStack* s : stacks) {
    // One stack at a time: its host re-layout is freed before the next one is made.
    const std::vector<uint8_t> host = relayout_weights_sm90(*s, epilogue);
    FP4MOE_CHECK(host.size() == size_t(s->num_experts) * per_expert, "sm90 upload: re-laid size mismatch");
    if (!mx)
      for (int64_t e = 0; e < s->num_experts; ++e) {
        FP4MOE_CHECK(std::isfinite(s->global_scale[size_t(e)]), "sm90 upload: expert {} global scale is not finite",
                     e0 + e);
        d.global_scale_host[size_t(e0 + e)] = s->global_scale[size_t(e)];
      }
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d.tiles + size_t(e0) * per_expert, host.data(), host.size(),
                                      cudaMemcpyHostToDevice, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` dies at the end of this iteration
    e0 += s->num_experts;
  }
  FP4MOE_CUDA_CHECK(
      cudaMemcpyAsync(d.global_scale, d.global_scale_host.data(), size_t(E) * 4, cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

DeviceExpertWeights upload_weights(const ExpertStack& w, Epilogue epilogue, cudaStream_t stream) {
  return upload_weights_concat({&w}, epilogue, stream);
}

}  // namespace fp4moe::cuda
