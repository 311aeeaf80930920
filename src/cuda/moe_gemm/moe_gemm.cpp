// Host side of the sm90 grouped GEMM family: printing, feasibility (can_implement), the
// configs the tuner may pick, argument checks, the activation tensor map, and the launch.
// Compiles on every arch; without an sm_90a build (FP4MOE_HAVE_SM90) or on a GPU other than
// sm_90 it reports why instead of launching.
#include "cuda/moe_gemm/moe_gemm.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <sstream>

#include <fmt/ostream.h>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/moe_gemm/sm90_launch.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"

namespace fp4moe::cuda {

namespace {

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::SiluMul: return "silu_mul";
    case Epilogue::RowScale: return "row_scale";
  }
  return "?";
}

// Stage count per block_n: deeper rings for the weight-streaming (small block_n) configs.
int stages_for(int block_n, int num_experts) {
  const int cap = block_n <= 16 ? 16 : block_n <= 64 ? 12 : block_n <= 128 ? 8 : 6;
  return sm90::sm90_max_stages(block_n, num_experts, cap);
}

// The decode kernel runs kDecodeCtasPerSm CTAs per SM: the deepest ring that fits its share.
int decode_stages_for(int block_n, int num_experts) {
  return sm90::sm90_decode_max_stages(block_n, num_experts, 16);
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    FP4MOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    FP4MOE_CHECK(q == cudaDriverEntryPointSuccess && f, "cuTensorMapEncodeTiled is not available from the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// x [rows, k] BF16, box {64, block_n}, 128-byte swizzle; rows past `rows` read as zeros.
CUtensorMap make_x_tensor_map(const void* x, int rows, int k, int block_n) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {cuuint32_t(sm90::kBlockK), cuuint32_t(block_n)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(x), dims, strides, box,
                                 elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FP4MOE_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult {}) for x [{}, {}]", int(r), rows, k);
  return map;
}

bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

size_t act_buffer_bytes(const MoeGemmDesc& d) { return sm90::align_up(size_t(d.max_tokens) * size_t(d.k) * 2, 256); }

}  // namespace

std::ostream& operator<<(std::ostream& os, const MoeGemmDesc& d) {
  return os << "MoeGemmDesc{E=" << d.num_experts << ", N=" << d.n << ", K=" << d.k << ", max_tokens=" << d.max_tokens
            << ", weight=" << weight_format_name(d.weight)
            << ", act=" << (d.act == ActFormat::BF16 ? "bf16" : "nvfp4_emulated")
            << ", epilogue=" << epilogue_name(d.epilogue) << "}";
}

std::string can_implement(const MoeGemmDesc& d, const TileConfig& c, int sm) {
  const bool decode = c.kernel == GemmKernel::Sm90Decode;
  if (c.kernel != GemmKernel::Sm90Wgmma && !decode)
    return fmt::format("{} is not an sm90 config (see generic_can_implement / dequant_cublas_can_implement)",
                       kernel_name(c.kernel));
  const char* name = kernel_name(c.kernel);
#ifndef FP4MOE_HAVE_SM90
  return fmt::format("{} was not compiled: this build has no sm_90a target (CMAKE_CUDA_ARCHITECTURES)", name);
#endif
  if (sm != 90) return fmt::format("{} needs sm_90a (TMA, {}); this GPU is sm_{}", name, decode ? "mbarrier" : "wgmma", sm);
  if (d.weight != WeightFormat::NVFP4 && d.weight != WeightFormat::MXFP4)
    return fmt::format("{} takes NVFP4 or MXFP4 weights, not {}", name, weight_format_name(d.weight));
  if (d.num_experts < 1) return fmt::format("num_experts = {} (need >= 1)", d.num_experts);
  if (d.n <= 0 || d.n % sm90::kBlockM != 0)
    return fmt::format("N = {} is not a positive multiple of {} (the weight-row tile)", d.n, sm90::kBlockM);
  if (d.k <= 0 || d.k % sm90::kBlockK != 0)
    return fmt::format("K = {} is not a positive multiple of {} (the K stage)", d.k, sm90::kBlockK);
  if (d.max_tokens < 0) return fmt::format("max_tokens = {} is negative", d.max_tokens);
  if (c.block_m != sm90::kBlockM || c.block_k != sm90::kBlockK)
    return fmt::format("block_m x block_k = {} x {}; {} is built for {} x {}", c.block_m, c.block_k, name,
                       sm90::kBlockM, sm90::kBlockK);
  if (decode ? !sm90::sm90_decode_block_n_supported(c.block_n) : !sm90::sm90_block_n_supported(c.block_n))
    return fmt::format("block_n = {} is not instantiated ({})", c.block_n, decode ? "8, 16, 32" : "16, 64, 128, 256");
  if (c.split_k != 1 || c.cluster != 1)
    return fmt::format("split_k = {}, cluster = {}: {} supports 1 and 1 (it splits K itself)", c.split_k, c.cluster,
                       name);
  if (c.stages < 2) return fmt::format("stages = {} (need >= 2)", c.stages);
  const sm90::Sm90SmemLayout L = sm90::sm90_smem_layout(c.block_n, c.stages, d.num_experts);
  const size_t limit = decode ? sm90::sm90_decode_smem_limit() : sm90::sm90_smem_limit(c.block_n);
  const int ctas = decode ? sm90::kDecodeCtasPerSm : sm90::sm90_ctas_per_sm(c.block_n);
  if (L.total > limit)
    return fmt::format(
        "needs {} B of shared memory (B {} + A {} + scales {} + barriers {} + scheduler {} + align {} + epilogue {}), "
        "sm_90 allows {} B per CTA at {} CTA(s) per SM",
        L.total, L.b_bytes, L.a_bytes, L.scale_bytes, L.barrier_bytes, L.sched_bytes, L.align_slack, L.epilogue_bytes,
        limit, ctas);
  return {};
}

std::vector<TileConfig> candidate_configs(const MoeGemmDesc& d) {
  std::vector<TileConfig> out;
  const int experts = std::max(d.num_experts, 1);
  auto add = [&](GemmKernel kernel, int bn, int stages) {
    if (stages < 2) return;
    TileConfig c;
    c.kernel = kernel;
    c.block_m = sm90::kBlockM;
    c.block_n = bn;
    c.block_k = sm90::kBlockK;
    c.stages = stages;
    out.push_back(c);
  };
  for (int bn : {8, 16, 32}) add(GemmKernel::Sm90Decode, bn, decode_stages_for(bn, experts));
  for (int bn : {16, 64, 128, 256}) add(GemmKernel::Sm90Wgmma, bn, stages_for(bn, experts));
  return out;
}

TileConfig default_config(const MoeGemmDesc& d, double tokens_per_expert) {
  const std::vector<TileConfig> all = candidate_configs(d);
  FP4MOE_CHECK(!all.empty(), "sm90: no config fits {} experts", d.num_experts);
  // Decode regime (weights streamed once per token tile): the mma.sync kernel with the
  // narrowest tile that holds most experts' tokens in one tile (an expert with more tokens
  // reads its weights once per tile). Then wgmma: block_n 64 to ~48 tokens per expert, 128 to
  // ~128; at 256 per expert (T = 8192, top-8 of 256) the tuner measured 128x256 s6 16 % faster
  // than 128x128 s8, so 256 from there on. Crossovers: bench/RESULTS.md.
  GemmKernel kernel = GemmKernel::Sm90Wgmma;
  int want = 256;
  if (tokens_per_expert <= 4.5) kernel = GemmKernel::Sm90Decode, want = 8;
  else if (tokens_per_expert <= 12) kernel = GemmKernel::Sm90Decode, want = 16;
  else if (tokens_per_expert <= 24) kernel = GemmKernel::Sm90Decode, want = 32;
  else if (tokens_per_expert <= 48) want = 64;
  else if (tokens_per_expert <= 128) want = 128;
  for (const TileConfig& c : all)
    if (c.kernel == kernel && c.block_n == want) return c;
  return all.back();
}

namespace {
// Workspace = [W4A4: fake-quantized x, then the FP32 global scalar (256 B)] [split-K state].
size_t act_workspace_bytes(const MoeGemmDesc& d) {
  return d.act == ActFormat::NVFP4_EMULATED ? sm90::align_up(act_buffer_bytes(d) + 256, 256) : 0;
}
}  // namespace

size_t workspace_bytes(const MoeGemmDesc& d, const TileConfig& c) {
  return act_workspace_bytes(d) + sm90::sm90_split_workspace_bytes(c.block_n);
}

void run_moe_gemm(const MoeGemmDesc& d, const TileConfig& c, const DeviceExpertWeights& w, const MoeGemmArgs& a) {
  // Static checks first (shapes, config, pointers: testable without a GPU), then the device.
  if (std::string why = can_implement(d, c, 90); !why.empty()) FP4MOE_FAIL("run_moe_gemm {}: {}", to_string(c), why);
  FP4MOE_CHECK(w.tiles && w.num_experts == d.num_experts && w.n == d.n && w.k == d.k && w.format == d.weight,
               "run_moe_gemm: weights [{}, {}, {}] {} do not match {}", w.num_experts, w.n, w.k,
               weight_format_name(w.format), fmt::streamed(d));
  FP4MOE_CHECK(w.silu_layout == (d.epilogue == Epilogue::SiluMul),
               "run_moe_gemm: weights were uploaded for {} but the epilogue is {}",
               w.silu_layout ? "silu_mul" : "none/row_scale", epilogue_name(d.epilogue));
  FP4MOE_CHECK(a.m_total >= 0 && (d.max_tokens == 0 || a.m_total <= d.max_tokens),
               "run_moe_gemm: m_total = {} outside [0, max_tokens = {}]", a.m_total, d.max_tokens);
  FP4MOE_CHECK(a.x && a.y && a.expert_offsets, "run_moe_gemm: x, y and expert_offsets must be set");
  const int e_begin = a.expert_begin, e_end = a.expert_end < 0 ? d.num_experts : a.expert_end;
  FP4MOE_CHECK(0 <= e_begin && e_begin < e_end && e_end <= d.num_experts,
               "run_moe_gemm: expert range [{}, {}) outside [0, {})", e_begin, e_end, d.num_experts);
  FP4MOE_CHECK(aligned(a.x, 16), "run_moe_gemm: x is not 16-byte aligned (TMA needs it)");
  FP4MOE_CHECK(aligned(a.y, 16), "run_moe_gemm: y is not 16-byte aligned");
  FP4MOE_CHECK(aligned(a.expert_offsets, 4), "run_moe_gemm: expert_offsets is not 4-byte aligned");
  FP4MOE_CHECK(d.epilogue != Epilogue::RowScale || (a.row_scale && aligned(a.row_scale, 4)),
               "run_moe_gemm: RowScale needs a 4-byte aligned row_scale");
  if (a.m_total == 0) return;

  const DeviceInfo& dev = current_device();
  if (dev.cc != 90) FP4MOE_FAIL("run_moe_gemm {}: {}", to_string(c), can_implement(d, c, dev.cc));

  const void* x = a.x;
  const float* act_global = nullptr;
  if (d.act == ActFormat::NVFP4_EMULATED) {
    FP4MOE_CHECK(d.weight == WeightFormat::NVFP4, "run_moe_gemm: W4A4 emulation needs NVFP4 weights");
    FP4MOE_CHECK(d.max_tokens >= a.m_total && d.max_tokens > 0, "run_moe_gemm: W4A4 needs max_tokens >= m_total");
    FP4MOE_CHECK(a.workspace && aligned(a.workspace, 256), "run_moe_gemm: W4A4 needs a 256-byte aligned workspace of {} B",
                 workspace_bytes(d, c));
    uint8_t* ws = static_cast<uint8_t*>(a.workspace);
    float* ws_global = reinterpret_cast<float*>(ws + act_buffer_bytes(d));
    act_global = a.act_global_scale;
    if (!act_global) {
      compute_act_global_scale(a.x, a.m_total, d.k, ws_global, a.stream);
      act_global = ws_global;
    }
    fake_quantize_activations_nvfp4(a.x, ws, a.m_total, d.k, act_global, a.stream);
    x = ws;
  }
#ifdef FP4MOE_HAVE_SM90
  const CUtensorMap map = make_x_tensor_map(x, a.m_total, d.k, c.block_n);
  sm90::Sm90GemmLaunch l;
  l.x_map = &map;
  l.tiles = w.tiles + size_t(e_begin) * sm90::sm90_expert_tile_bytes(d.n, d.k);
  l.global_scale = w.global_scale + e_begin;
  l.act_global = act_global;
  l.offsets = a.expert_offsets + e_begin;
  l.row_scale = a.row_scale;
  l.y = a.y;
  l.num_experts = e_end - e_begin;
  l.n = d.n;
  l.k = d.k;
  l.m_rows = a.m_total;
  l.y_ld = d.epilogue == Epilogue::SiluMul ? d.n / 2 : d.n;
  l.block_n = c.block_n;
  l.stages = c.stages;
  l.epilogue = int(d.epilogue);
  l.mxfp4 = d.weight == WeightFormat::MXFP4;
  l.decode = c.kernel == GemmKernel::Sm90Decode;
  l.sm_count = dev.sm_count;
  FP4MOE_CHECK(a.force_splits >= 0, "run_moe_gemm: force_splits = {} is negative", a.force_splits);
  l.force_splits = a.force_splits;
  // Adaptive split-K needs its workspace part; without a workspace the kernel never splits.
  if (a.workspace && sm90::sm90_split_k_capable(c.block_n)) {
    FP4MOE_CHECK(aligned(a.workspace, 256), "run_moe_gemm: the workspace must be 256-byte aligned");
    l.split_ws = static_cast<uint8_t*>(a.workspace) + act_workspace_bytes(d);
  }
  sm90::launch_grouped_gemm(l, a.stream);
#endif
}

}  // namespace fp4moe::cuda
