// Re-layout of FP4 expert weights into the sm90 kernel's chunks (weight_relayout.hpp). The
// kernel then reads each thread's codes for 4 K steps with one 16-byte shared load, and its
// scales with one 8-byte broadcast load.
#include "cuda/moe_gemm/weight_relayout.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cuda/moe_gemm/sm90_fp4_word.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"
#include "format/codecs.hpp"

namespace fp4moe::cuda {

using sm90::kBlockK;
using sm90::kBlockM;
using sm90::kChunkBytes;
using sm90::kCodeBytes;

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

// The chunk byte of every |E4M3| code 0..0x7E, computed once (each has one; a code without
// would be looked up through nvfp4_scale_byte, which throws).
struct Nvfp4ScaleBytes {
  uint8_t b[128] = {};
  bool ok[128] = {};
  Nvfp4ScaleBytes() {
    for (int c = 0; c < 0x7F; ++c) try {
        b[c] = nvfp4_scale_byte(uint8_t(c));
        ok[c] = true;
      } catch (const Error&) {
      }
  }
  uint8_t operator()(uint8_t c) const { return ok[c] ? b[c] : nvfp4_scale_byte(c); }
};

}  // namespace

void check_relayout_sm90(const ExpertStack& w) {
  FP4MOE_CHECK(w.is_fp4(), "sm90 upload: weights are {}, the sm90 kernel takes NVFP4 or MXFP4",
               weight_format_name(w.format));
  const int64_t E = w.num_experts, N = w.n, K = w.k;
  FP4MOE_CHECK(E > 0 && N > 0 && K > 0, "sm90 upload: empty expert stack [{}, {}, {}]", E, N, K);
  FP4MOE_CHECK(N % kBlockM == 0, "sm90 upload: N = {} is not a multiple of {}", N, kBlockM);
  FP4MOE_CHECK(K % kBlockK == 0, "sm90 upload: K = {} is not a multiple of {}", K, kBlockK);
  const bool mx = w.format == WeightFormat::MXFP4;
  const int64_t block = w.block();
  if (w.is_view()) {
    FP4MOE_CHECK(w.parts >= 1 && N % w.parts == 0 && w.views.size() == size_t(E * w.parts),
                 "sm90 upload: {} part views do not match {} experts x {} parts", w.views.size(), E, w.parts);
    return;
  }
  FP4MOE_CHECK(w.packed.size() == size_t(E * N * K / 2) && w.scales.size() == size_t(E * N * (K / block)) &&
                   (mx || w.global_scale.size() == size_t(E)),
               "sm90 upload: expert stack buffers do not match [{}, {}, {}]", E, N, K);
}

size_t sm90_row_tile_bytes(int64_t k) { return size_t(k / kBlockK) * kChunkBytes; }

void relayout_row_tile_sm90(const Fp4ExpertRows& x, WeightFormat format, int64_t N, int64_t K, int64_t rt,
                            Epilogue epilogue, int64_t e, uint8_t* out) {
  static const Nvfp4ScaleBytes nv_bytes;
  const bool mx = format == WeightFormat::MXFP4;
  const int64_t block = mx ? 32 : 16;
  const bool silu = epilogue == Epilogue::SiluMul;
  const int64_t KT = K / kBlockK;
  for (int cw = 0; cw < 2; ++cw)
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const int64_t rows[2] = {logical_row(silu, N, rt, cw, warp, g, 0), logical_row(silu, N, rt, cw, warp, g, 1)};
        const uint8_t* prow[2] = {x.packed(rows[0]), x.packed(rows[1])};
        const uint8_t* srow[2] = {x.raw_scales(rows[0]), x.raw_scales(rows[1])};
        const bool resc[2] = {x.rescaled(rows[0]), x.rescaled(rows[1])};
        for (int64_t kt = 0; kt < KT; ++kt) {
          uint8_t* chunk = out + size_t(kt * kChunkBytes);
          for (int ks = 0; ks < 4; ++ks) {
            const int64_t kb = kt * kBlockK + ks * 16;
            uint8_t sbyte[2];
            uint8_t flip[2];
            bool zero[2];
            for (int h = 0; h < 2; ++h) {
              uint8_t s = srow[h][kb / block];
              if (resc[h]) s = x.scale(rows[h], kb / block);  // unified gate/up global (view mode)
              flip[h] = 0;
              zero[h] = false;
              if (mx) {
                FP4MOE_CHECK(s >= 9 && s <= 135,
                             "sm90 upload: MXFP4 scale 2^{} (expert {}, row {}) is outside the supported "
                             "[2^-118, 2^8]",
                             int(s) - 127, e, rows[h]);
              } else {
                FP4MOE_CHECK((s & 0x7F) != 0x7F, "sm90 upload: NaN E4M3 scale (expert {}, row {}, k {})", e, rows[h],
                             kb);
                if (s & 0x80) flip[h] = 8;  // negative scale: fold the sign into the codes
                s &= 0x7F;
                zero[h] = s == 0;           // zero scale: zero codes (value 0 either way)
                s = nv_bytes(s);
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
              const uint8_t byte = prow[h][col / 2];  // col even: lo, hi
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

std::vector<uint8_t> relayout_weights_sm90(const ExpertStack& w, Epilogue epilogue) {
  check_relayout_sm90(w);
  const int64_t E = w.num_experts, N = w.n, K = w.k, RT = N / kBlockM;
  const size_t tile = sm90_row_tile_bytes(K);
  std::vector<uint8_t> host(size_t(E * RT) * tile);
  parallel_for(E * RT, default_num_threads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t et = begin; et < end; ++et) {
      const int64_t e = et / RT;
      const Fp4ExpertRows x(w, e);
      relayout_row_tile_sm90(x, w.format, N, K, et % RT, epilogue, e, host.data() + size_t(et) * tile);
    }
  });
  return host;
}

}  // namespace fp4moe::cuda
