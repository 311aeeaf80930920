// Internal to cuda/attention: the FlashInfer glue behind MlaSm90 (mla.cpp). Declarations only:
// FlashInfer's headers (and its CCCL / CUTLASS) are included by the sm90_mla_flashinfer_*.cu
// translation units alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/attention/mla.hpp"

namespace fp4moe::cuda::attention::flashinfer_glue {

struct Plan {
  std::vector<int64_t> info;  // MLAPlanInfo::ToVector()
  size_t staged_int_bytes = 0;
  int works = 0;              // work items scheduled (<= MlaSm90::kMaxWorks)
};

// sm90_mla_flashinfer_plan.cu: FlashInfer's MLAPlan (causal), schedule written into `pinned`
// (host, int_bytes); the caller copies staged_int_bytes of it to int_ws.
Plan plan(void* float_ws, size_t float_bytes, void* int_ws, void* pinned, size_t int_bytes,
          std::vector<int32_t>& q_indptr, std::vector<int32_t>& kv_indptr, std::vector<int32_t>& kv_len,
          int num_heads, cudaStream_t stream);

struct Launch {
  const std::vector<int64_t>* info = nullptr;
  void* float_ws = nullptr;
  void* int_ws = nullptr;
  int num_heads = 0;
  float sm_scale = 0;
  int page_size = 0;  // 1 for sparse rows (kv_indices are slots)
};
// sm90_mla_flashinfer_bf16.cu / _fp8.cu: one instantiation each (causal, ckv 512, kpe 64,
// Q / O BF16, KV BF16 or E4M3). Return the launch status.
cudaError_t run_bf16(const Launch& l, const MlaRunArgs& a, cudaStream_t stream);
cudaError_t run_fp8(const Launch& l, const MlaRunArgs& a, cudaStream_t stream);

// ---- expanded-form prefill (FA3 ragged, head_dim 256 / 256) ----------------------------------

// sm90_mla_flashinfer_plan.cu: FlashInfer's PrefillSM90Plan (causal, heads = kv heads), schedule
// written into `pinned` and copied to int_ws by the planner itself (staged_int_bytes = 0).
Plan plan_prefill(void* float_ws, size_t float_bytes, void* int_ws, void* pinned, size_t int_bytes,
                  std::vector<int32_t>& qo_indptr, std::vector<int32_t>& kv_indptr, std::vector<int32_t>& kv_len,
                  int num_heads, cudaStream_t stream);

struct PrefillLaunch {
  const std::vector<int64_t>* info = nullptr;  // PrefillPlanSM90Info::ToVector()
  void* int_ws = nullptr;
  const void* q = nullptr;  // [nnz_qo, heads, 256]
  void* k = nullptr;        // [nnz_kv, heads, 256] (strided)
  void* v = nullptr;        // [nnz_kv, heads, 256] (strided)
  void* o = nullptr;        // [nnz_qo, heads, 256]
  float* lse = nullptr;
  int64_t q_stride_n = 0, q_stride_h = 0, kv_stride_n = 0, kv_stride_h = 0, o_stride_n = 0, o_stride_h = 0;
  int64_t nnz_qo = 0, nnz_kv = 0;
  int num_heads = 0;
  float sm_scale = 0;
};
// sm90_mla_prefill_flashinfer_bf16.cu: the one instantiation (causal, per-head schedule;
// cudaErrorNotSupported when the plan chose the all-heads schedule, > 4096 query tiles).
cudaError_t run_prefill_expanded_bf16(const PrefillLaunch& l, cudaStream_t stream);

}  // namespace fp4moe::cuda::attention::flashinfer_glue
