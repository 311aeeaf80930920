// Plain arithmetic of the Blackwell block-scaled NVFP4 grouped GEMMs (sm_100a / sm_120a,
// CUTLASS; compiled, not run): where each byte of the operands, their scale factors and the
// per-call argument arrays lives. No CUDA or CUTLASS types: the kernels' translation units,
// the activation quantizer, the weight re-layout and the host tests all use this one file; the
// tests check it against CUTLASS's own layout functors (sm1xx_bs_kernels.hpp: host hooks).
//
// Orientation ("swap AB", the MoE decode orientation of CUTLASS example 92 and FlashInfer's
// SM120 grouped GEMM): CUTLASS A = an expert's weights [N, K] (K-major, the checkpoint's
// layout: element 2j in the low nibble of byte j), CUTLASS B = that expert's activations
// [m_e, K] (K-major), D = y [m_e, N] BF16 row-major (CUTLASS column-major N x m_e). Tile M
// covers weight rows, tile N covers tokens: few tokens per expert cost a narrow N tile, not a
// 128-row tile of padding.
//
// Scale factors (NVFP4: one E4M3 per 16 elements along K) in CUTLASS's
// Sm1xxBlockScaledConfig layout: 128-row x 4-SF atoms of 512 B; inside an atom the SF of
// (row r, SF column c) sits at (r % 32) * 16 + (r / 32) * 4 + c; atoms follow each other along
// K first (ceil(K / 64) atoms per 128 rows), then along rows. Rows pad to 128, SF columns to 4.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fp4moe::cuda::sm1xx {

constexpr int kSfVec = 16;        // NVFP4 elements per scale factor
constexpr int kSfAtomRows = 128;  // Sm1xxBlockScaledBasicChunk::Blk_MN
constexpr int kSfAtomCols = 4;    // Sm1xxBlockScaledBasicChunk::Blk_SF
constexpr int kSfAtomBytes = kSfAtomRows * kSfAtomCols;
constexpr int kArgAlign = 256;    // every workspace piece starts on a 256 B boundary

FP4MOE_HOST_DEVICE constexpr int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// SF columns of a K-long row (K / 16 padded to the atom's 4) and SF rows (padded to 128).
FP4MOE_HOST_DEVICE constexpr int64_t sf_cols(int64_t k) { return round_up(k / kSfVec, kSfAtomCols); }
FP4MOE_HOST_DEVICE constexpr int64_t sf_rows(int64_t rows) { return round_up(rows, kSfAtomRows); }
// Bytes of the SF tensor of a [rows, K] operand.
FP4MOE_HOST_DEVICE constexpr int64_t sf_bytes(int64_t rows, int64_t k) { return sf_rows(rows) * sf_cols(k); }

// Byte offset of the SF of (row, SF column kb = k / 16) in a [*, K] operand's SF tensor.
FP4MOE_HOST_DEVICE constexpr int64_t sf_offset(int64_t row, int64_t kb, int64_t k) {
  const int64_t atom = (row / kSfAtomRows) * (sf_cols(k) / kSfAtomCols) + kb / kSfAtomCols;
  const int64_t r = row % kSfAtomRows;
  return atom * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + kb % kSfAtomCols;
}

// ---- grouped activations: expert e owns rows [off_e, off_{e+1}) of the permuted batch ----

// First SF row of expert e: atoms start on 128-row boundaries, so each expert's SF begins on
// its own atom; (off_e / 128 + e) * 128 leaves room for every expert's padded rows
// (act_sf_row_base(e + 1) >= act_sf_row_base(e) + sf_rows(m_e) for any offsets).
FP4MOE_HOST_DEVICE constexpr int64_t act_sf_row_base(int64_t e, int64_t off_e) { return (off_e / kSfAtomRows + e) * kSfAtomRows; }
// SF rows for a batch of m_total rows over `experts` experts (the base of a virtual expert E).
constexpr int64_t act_sf_rows_bound(int64_t m_total, int64_t experts) { return act_sf_row_base(experts, m_total); }

// ---- the MoE decode recipe (CUTLASS example 92): per-expert slabs of max_n token rows ----
// Activations [E, max_n, K], their SF [E, sf_rows(max_n), sf_cols(K)], output [E, max_n, N].
FP4MOE_HOST_DEVICE constexpr int64_t slab_row(int64_t e, int64_t row_in_expert, int64_t max_n) {
  return e * max_n + row_in_expert;
}
FP4MOE_HOST_DEVICE constexpr int64_t slab_sf_row(int64_t e, int64_t row_in_expert, int64_t max_n) {
  return e * sf_rows(max_n) + row_in_expert;
}

// ---- the per-call workspace ----

// sizeof() of the CUTLASS per-group argument types of one instantiation (from its translation
// unit, sm1xx_bs_kernels.hpp), and the CUTLASS kernel's own workspace.
struct BsArgTypeSizes {
  int64_t problem_shape = 0, stride_a = 0, stride_b = 0, stride_d = 0, layout_sfa = 0, layout_sfb = 0;
};

// Offsets (bytes from the workspace base, each kArgAlign-aligned) of every piece of one call.
struct BsWorkspaceLayout {
  int64_t problem_sizes = 0, ptr_a = 0, ptr_b = 0, ptr_sfa = 0, ptr_sfb = 0, ptr_d = 0;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0, layout_sfa = 0, layout_sfb = 0;
  int64_t alpha = 0, tokens_per_expert = 0;  // [E] FP32, [E] int32
  int64_t act_global = 0;                    // FP32 scalar: the activations' global when computed here
  int64_t act_fp4 = 0, act_sf = 0;           // quantized activations and their SF
  int64_t out = 0;                           // GEMM output before its last pass (slabs, or 2I-wide
                                             // gate | up for SiLU·up); empty when it writes y directly
  int64_t cutlass = 0;                       // CUTLASS's workspace
  int64_t total = 0;
};

// groups: experts of the call; rows: activation rows (grouped: m_total; slabs: E * max_n);
// act_sf_rows: SF rows (grouped: act_sf_rows_bound; slabs: E * sf_rows(max_n)); out_bytes: the
// GEMM output kept in the workspace (0 when it writes y in place).
constexpr BsWorkspaceLayout bs_workspace_layout(int64_t groups, int64_t rows, int64_t act_sf_rows, int64_t k,
                                                const BsArgTypeSizes& t, int64_t out_bytes, int64_t cutlass_bytes) {
  BsWorkspaceLayout w;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t here = at;
    at = round_up(at + bytes, kArgAlign);
    return here;
  };
  w.problem_sizes = take(groups * t.problem_shape);
  w.ptr_a = take(groups * 8);
  w.ptr_b = take(groups * 8);
  w.ptr_sfa = take(groups * 8);
  w.ptr_sfb = take(groups * 8);
  w.ptr_d = take(groups * 8);
  w.stride_a = take(groups * t.stride_a);
  w.stride_b = take(groups * t.stride_b);
  w.stride_d = take(groups * t.stride_d);
  w.layout_sfa = take(groups * t.layout_sfa);
  w.layout_sfb = take(groups * t.layout_sfb);
  w.alpha = take(groups * 4);
  w.tokens_per_expert = take(groups * 4);
  w.act_global = take(4);
  w.act_fp4 = take(rows * k / 2);
  w.act_sf = take(act_sf_rows * sf_cols(k));
  w.out = take(out_bytes);
  w.cutlass = take(cutlass_bytes);
  w.total = at;
  return w;
}

}  // namespace fp4moe::cuda::sm1xx
