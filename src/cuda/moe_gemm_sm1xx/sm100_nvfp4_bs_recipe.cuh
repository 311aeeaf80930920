// sm_100a NVFP4 grouped GEMMs as CUTLASS types (tcgen05.mma kind::mxf4nvf4, accumulators in
// tensor memory), in the swap-AB orientation of sm1xx_bs_layout.hpp, BF16 D, no C source:
//   Sm100Nvfp4GroupedRecipe<false, ...>: ptr-array grouped, 1-SM tiles (M = 128), as CUTLASS
//     example 75's MMA1SMConfig (KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100);
//   Sm100Nvfp4GroupedRecipe<true, ...>:  2-SM tiles (M = 256 over a CTA pair, cluster 2x1);
//   Sm100Nvfp4MoeDecodeRecipe: CUTLASS example 92's MoE decode kernel
//     (KernelMixedTmaCpAsyncWarpSpecialized1SmBlockScaledSm100, MoEProblemShape): weights
//     stream by TMA, the few activation rows by cp.async (no per-expert TMA descriptor update),
//     activations and output in per-expert slabs of max_n rows.
// Compiled, not run.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"

namespace fp4moe::cuda::sm1xx {

struct Sm100Nvfp4Common {
  using ElementOperand = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // weights (N_w, K), K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // activations: token rows, K-major
  using LayoutD = cutlass::layout::ColumnMajor;  // y[token][feature]
  static constexpr int kAlignAB = 32;
  static constexpr int kAlignD = 8;
  static constexpr int64_t kBuilderCapacity = cutlass::gemm::collective::detail::sm100_smem_capacity_bytes;
};

template <bool k2Sm, int kTileM, int kTileN, int kTileK, int kStages = 0, bool kF32Source = false>
struct Sm100Nvfp4GroupedRecipe : Sm100Nvfp4Common {
  static constexpr BsRecipe kRecipe = k2Sm ? BsRecipe::Sm100Grouped2Sm : BsRecipe::Sm100Grouped1Sm;
  static constexpr int kM = kTileM, kN = kTileN, kK = kTileK;
  static constexpr bool kAutoStages = kStages == 0, kSource = kF32Source, kSlabs = false;
  static_assert(kTileM == (k2Sm ? 256 : 128), "1-SM tiles are 128 rows, 2-SM tiles 256");

  using ElementC = std::conditional_t<kF32Source, float, void>;
  static constexpr int kAlignC = kF32Source ? 4 : 8;
  using Tile = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using Cluster = std::conditional_t<k2Sm, cute::Shape<cute::_2, cute::_1, cute::_1>, cute::Shape<cute::_1, cute::_1, cute::_1>>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using MainSchedule = std::conditional_t<k2Sm, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmNvf4Sm100,
                                          cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>;
  using EpiSchedule = std::conditional_t<k2Sm, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
                                         cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignC, ElementD, LayoutD*,
      kAlignD, EpiSchedule>::CollectiveOp;
  using StageCount = std::conditional_t<
      kStages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<kStages>>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementOperand, LayoutA*, kAlignAB,
      ElementOperand, LayoutB*, kAlignAB, float, Tile, Cluster, StageCount, MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <int kTileN, int kStages = 0>
struct Sm100Nvfp4MoeDecodeRecipe : Sm100Nvfp4Common {
  static constexpr BsRecipe kRecipe = BsRecipe::Sm100MoeDecode;
  static constexpr int kM = 128, kN = kTileN, kK = 256;
  static constexpr bool kAutoStages = kStages == 0, kSource = false, kSlabs = true;

  using ElementC = void;
  static constexpr int kAlignC = 8;
  using Tile = cute::Shape<cute::Int<kM>, cute::Int<kN>, cute::Int<kK>>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ProblemShape = cutlass::gemm::MoEProblemShape<cute::Shape<int, int, int>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD, kAlignC, ElementD, LayoutD,
      kAlignD, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
  using StageCount = std::conditional_t<
      kStages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<kStages>>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementOperand, LayoutA, kAlignAB,
      ElementOperand, LayoutB, kAlignAB, float, Tile, Cluster, StageCount,
      cutlass::gemm::KernelMixedTmaCpAsyncWarpSpecialized1SmBlockScaledSm100>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

}  // namespace fp4moe::cuda::sm1xx
