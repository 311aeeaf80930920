// sm_120a NVFP4 grouped GEMM as CUTLASS types: the ptr-array block-scaled kernel of CUTLASS
// example 79d (Sm120, OpClassBlockScaledTensorOp, nv_float4_t<float_e2m1_t> on both sides,
// cluster 1x1x1, cooperative schedule picked by KernelScheduleAuto), in the swap-AB
// orientation of sm1xx_bs_layout.hpp and with a BF16 D and no C source (the routing weight and
// SiLU·up are separate small kernels: sm1xx_act_quant.cu). The facts TU instantiates the types
// of every listed config; the kernel TUs (one per file) instantiate the kernel of a few.
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

// kStages 0: CUTLASS's StageCountAutoCarveout<sizeof(epilogue SharedStorage)>; kF32Source: the
// epilogue also reads an FP32 C (only to compare shared-memory needs; never launched).
template <int kTileM, int kTileN, int kTileK, int kStages = 0, bool kF32Source = false>
struct Sm120Nvfp4GroupedRecipe {
  static constexpr BsRecipe kRecipe = BsRecipe::Sm120Grouped;
  static constexpr int kM = kTileM, kN = kTileN, kK = kTileK;
  static constexpr bool kAutoStages = kStages == 0, kSource = kF32Source, kSlabs = false;

  using ElementOperand = cutlass::nv_float4_t<cutlass::float_e2m1_t>;  // A weights, B activations
  using ElementD = cutlass::bfloat16_t;
  using ElementC = std::conditional_t<kF32Source, float, void>;
  using LayoutA = cutlass::layout::RowMajor;     // weights (N_w, K), K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // activations (K, m_e): token rows, K-major
  using LayoutD = cutlass::layout::ColumnMajor;  // (N_w, m_e): y[token][feature]
  static constexpr int kAlignAB = 32;            // 16 B of FP4 (TMA)
  static constexpr int kAlignD = 8;              // 16 B of BF16
  static constexpr int kAlignC = kF32Source ? 4 : 8;

  using Tile = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassBlockScaledTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignC, ElementD, LayoutD*,
      kAlignD, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
  using StageCount = std::conditional_t<
      kStages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<kStages>>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassBlockScaledTensorOp, ElementOperand, LayoutA*, kAlignAB,
      ElementOperand, LayoutB*, kAlignAB, float, Tile, Cluster, StageCount,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr int64_t kBuilderCapacity = cutlass::gemm::collective::detail::sm120_smem_capacity_bytes;
};

}  // namespace fp4moe::cuda::sm1xx
