// Re-layout of FP4 expert weights into the sm90 kernel's chunks (weight_relayout.hpp). The
// kernel then reads each thread's codes for 4 K steps with one 16-byte shared load, and its
// scales with one 8-byte broadcast load.
#include "cuda/moe_gemm/weight_relayout.hpp"

#include <array>
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

// The word bits of register j's two codes (the lo / hi nibble of one packed byte): a word is
// the OR of its four registers' (fp4_pack_word places every code bit on its own word bit).
struct WordTable {
  uint32_t w[4][256] = {};
  WordTable() {
    for (int j = 0; j < 4; ++j)
      for (int b = 0; b < 256; ++b) {
        uint8_t codes[4][2] = {};
        codes[j][0] = uint8_t(b & 0xF);
        codes[j][1] = uint8_t(b >> 4);
        w[j][b] = sm90::fp4_pack_word(codes);
      }
  }
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
  static const WordTable words;
  const bool mx = format == WeightFormat::MXFP4;
  const int64_t block = mx ? 32 : 16;
  const bool silu = epilogue == Epilogue::SiluMul;
  const int64_t KT = K / kBlockK;
  // The two weight rows of each group of 4 threads (warpgroup, warp, g): lanes g*4 .. g*4+3
  // share them (and their scales), each taking its own columns.
  struct Group {
    int64_t row[2];
    const uint8_t* packed[2];
    const uint8_t* scales[2];
    bool rescaled[2];
  };
  std::array<Group, 64> groups;
  for (int gi = 0; gi < 64; ++gi) {
    const int cw = gi / 32, warp = gi / 8 % 4, g = gi % 8;
    Group& G = groups[size_t(gi)];
    for (int h = 0; h < 2; ++h) {
      G.row[h] = logical_row(silu, N, rt, cw, warp, g, h);
      G.packed[h] = x.packed(G.row[h]);
      G.scales[h] = x.raw_scales(G.row[h]);
      G.rescaled[h] = x.rescaled(G.row[h]);
    }
  }
  for (int64_t kt = 0; kt < KT; ++kt) {
    uint8_t* chunk = out + size_t(kt * kChunkBytes);
    for (int gi = 0; gi < 64; ++gi) {
      const Group& G = groups[size_t(gi)];
      // Per K step ks and row h: the chunk's scale byte, and the transform of the row's code
      // bytes: (byte & keep) ^ flip (zero scale: zero codes; negative: sign folded in).
      uint8_t keep[4][2], flip[4][2];
      uint8_t* sdst = chunk + kCodeBytes + gi * 8;  // lane g*4's 8 scale bytes: [ks][h]
      for (int ks = 0; ks < 4; ++ks) {
        const int64_t kb = kt * kBlockK + ks * 16;
        for (int h = 0; h < 2; ++h) {
          uint8_t s = G.scales[h][kb / block];
          if (G.rescaled[h]) s = x.scale(G.row[h], kb / block);  // unified gate/up global (view mode)
          keep[ks][h] = 0xFF;
          flip[ks][h] = 0;
          if (mx) {
            FP4MOE_CHECK(s >= 9 && s <= 135,
                         "sm90 upload: MXFP4 scale 2^{} (expert {}, row {}) is outside the supported "
                         "[2^-118, 2^8]",
                         int(s) - 127, e, G.row[h]);
          } else {
            FP4MOE_CHECK((s & 0x7F) != 0x7F, "sm90 upload: NaN E4M3 scale (expert {}, row {}, k {})", e, G.row[h], kb);
            if (s & 0x80) flip[ks][h] = 0x88;  // negative scale: fold the sign into the codes
            s &= 0x7F;
            if (s == 0) keep[ks][h] = 0;       // zero scale: zero codes (value 0 either way)
            s = nv_bytes(s);
          }
          sdst[ks * 2 + h] = s;
        }
      }
      for (int t = 0; t < 4; ++t) {
        uint8_t* words_out = chunk + (gi * 4 + t) * 16;
        for (int ks = 0; ks < 4; ++ks) {
          // Register j holds columns (col, col + 1) = one packed byte of row h = j & 1:
          // col = kb + 2t (+ 8 for j >= 2).
          const int64_t c = (kt * kBlockK + ks * 16) / 2 + t;
          auto code = [&](int h, int64_t at) { return uint8_t((G.packed[h][at] & keep[ks][h]) ^ flip[ks][h]); };
          const uint32_t word = words.w[0][code(0, c)] | words.w[1][code(1, c)] | words.w[2][code(0, c + 4)] |
                                words.w[3][code(1, c + 4)];
          std::memcpy(words_out + ks * 4, &word, 4);
        }
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
