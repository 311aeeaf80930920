// The Blackwell block-scaled NVFP4 grouped GEMMs as plain C++ (no CUDA, no CUTLASS types):
// what each CUTLASS type says about itself (shared memory, stages, argument sizes), and the
// instantiations compiled into this binary with their host hooks and launchers.
// COMPILED, NOT RUN: no Blackwell GPU has executed any of this.
//
//   bs_type_facts(): every listed config of the tuner, from its CUTLASS types alone
//     (sizeof(GemmKernel::SharedStorage), the stage count the builder resolved, ...), computed
//     by the sm1xx facts translation units (types only, no kernel body) of the archs built.
//   bs_kernels(): the few configs instantiated as kernels (one per .cu file), each with
//     CUTLASS's own can_implement and get_workspace_size callable on the host without a GPU,
//     a host twin of the device argument builder (for the tests) and the launcher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_layout.hpp"

typedef struct CUstream_st* cudaStream_t;

namespace fp4moe::cuda::sm1xx {

enum class BsRecipe : uint8_t {
  Sm120Grouped,     // sm_120a: ptr-array grouped, mma.sync block_scale (OpClassBlockScaledTensorOp), cluster 1x1x1
  Sm100Grouped1Sm,  // sm_100a: ptr-array grouped, tcgen05 kind::mxf4nvf4, one SM per tile (M = 128)
  Sm100Grouped2Sm,  // sm_100a: ptr-array grouped, a CTA pair per tile (M = 256, cluster 2x1)
  Sm100MoeDecode,   // sm_100a: CUTLASS example 92 (weights by TMA, activations by cp.async, per-expert slabs)
};
std::string_view recipe_name(BsRecipe r);  // "sm120-bs", "sm100-bs-1sm", "sm100-bs-2sm", "sm100-bs-moe"
int recipe_cc(BsRecipe r);                 // 120 or 100

// What the CUTLASS types of one config say (compiled, not run).
struct BsKernelFacts {
  BsRecipe recipe = BsRecipe::Sm120Grouped;
  int tile_m = 0, tile_n = 0, tile_k = 0;  // CUTLASS MMA tile: weight rows x tokens x K
  int stages = 0;                          // CollectiveMainloop::DispatchPolicy::Stages
  bool auto_stages = false;                // resolved by StageCountAutoCarveout (else a fixed StageCount<s>)
  bool f32_source = false;                 // epilogue also loads an FP32 C source (a comparison case only)
  int64_t smem_bytes = 0;                  // sizeof(GemmKernel::SharedStorage): the launch's dynamic smem
  int64_t mainloop_bytes = 0;              // sizeof(CollectiveMainloop::TensorStorage): A, B, SFA, SFB rings
  int64_t epilogue_bytes = 0;              // sizeof(CollectiveEpilogue::TensorStorage)
  int64_t epilogue_carveout = 0;           // sizeof(CollectiveEpilogue::SharedStorage): what the auto count reserves
  int64_t builder_capacity = 0;            // the builder's smem capacity constant (cutlass::gemm::collective::detail)
  int threads = 0;                         // GemmKernel::MaxThreadsPerBlock
  std::string name() const;                // "sm120-bs 128x64x256 s3", "... auto", "... f32-source"
};

// Every listed config's facts from the archs this binary was built for (empty without CUDA or
// without sm_100a / sm_120a in CMAKE_CUDA_ARCHITECTURES).
std::span<const BsKernelFacts> bs_type_facts();

// ---- the instantiated kernels ----

// One call's inputs as the argument builder sees them. Addresses are plain integers so that
// the host twin can run on made-up bases (tests) and the device one on real pointers.
struct BsGroupInput {
  int n = 0, k = 0;             // weight rows (CUTLASS M) and K
  int groups = 0;               // experts in this call
  int expert_begin = 0;         // first expert (offsets stay absolute)
  const int32_t* offsets = nullptr;  // [E + 1] row offsets of the permuted batch (host twin: host memory)
  int max_n = 0;                // slab rows per expert (Sm100MoeDecode only)
  uint64_t w = 0, w_sf = 0;     // weights [E, N, K/2], their SF [E, sf_rows(N), sf_cols(K)]
  uint64_t x = 0, x_sf = 0;     // quantized activations and their SF (grouped: act_sf_row_base; slabs)
  uint64_t y = 0;               // output (grouped: [m_total, N] BF16; slabs: [E, max_n, N])
};

// Group g's arguments as the device builder writes them, in plain numbers (host twin only).
struct BsGroupArgsHost {
  int m = 0, n = 0, k = 0;                  // the CUTLASS problem (M = weight rows, N = tokens)
  uint64_t a = 0, b = 0, sfa = 0, sfb = 0, d = 0;
  int64_t stride_a[3] = {}, stride_b[3] = {}, stride_d[3] = {};  // CUTLASS strides, flattened (static 1 / 0 included)
  std::vector<int64_t> sfa_at, sfb_at;      // both SF layouts evaluated at the probes (byte offsets from sfa / sfb)
};

// Device launch of one instantiation: argument builder + CUTLASS run. The activations must
// already be quantized into the workspace (ws_layout.act_fp4 / act_sf).
struct BsLaunch {
  BsGroupInput in;                   // device addresses; offsets on the device
  const float* w_global = nullptr;   // [E] weight_scale_2 per expert (device)
  const float* act_global = nullptr; // device scalar: the activations' global (input_scale)
  void* workspace = nullptr;         // bs_workspace_layout(...).total bytes
  BsWorkspaceLayout ws_layout;
  int sm_count = 0, device = 0;
  cudaStream_t stream = nullptr;
};

struct BsKernel {
  BsKernelFacts facts;
  BsArgTypeSizes arg_sizes;
  // CUTLASS's can_implement (GemmUniversalAdapter) on host problem shapes: N x m_e x K per
  // group. Host only, no GPU. Returns "" when it accepts, else why.
  std::string (*can_implement)(int n, int k, const int32_t* m_per_group, int groups, int max_n);
  // CUTLASS's get_workspace_size for `groups` groups with sm_count SMs (host, no GPU).
  size_t (*cutlass_workspace_bytes)(int groups, int sm_count, int max_n);
  // The device argument builder's host twin for group g; probes: `probes` (row, k) pairs (row
  // in the operand, k an element index) at which to evaluate both SF layouts.
  BsGroupArgsHost (*describe_group)(const BsGroupInput& in, int g, const int64_t* probes, int probes_n);
  // Launches on l.stream; "" on success, else the CUTLASS / CUDA status in words.
  std::string (*run)(const BsLaunch& l);
};

// The instantiations compiled into this binary (by arch built), few and one per .cu file.
std::span<const BsKernel> bs_kernels();

}  // namespace fp4moe::cuda::sm1xx
