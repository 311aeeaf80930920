// The one place the MoE layer calls a grouped expert GEMM: the switch between the GEMM
// paths of cuda/moe_gemm/ (today: GemmKernel::Generic on the linear checkpoint layout;
// the sm_90a wgmma kernel when its upload/run entry points are linked in). Weights are
// uploaded in the layout of the chosen path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/moe_gemm/moe_gemm.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe {

// Which grouped GEMM the MoE layer runs (expert_gemm.cpp says how Auto decides).
enum class MoeGemmPath : uint8_t { Auto, Generic, Sm90 };
const char* moe_gemm_path_name(MoeGemmPath p);  // "auto" | "generic" | "sm90"

namespace moe {

class ExpertGemmWeights {
 public:
  virtual ~ExpertGemmWeights() = default;
  // y = epilogue(x · W_eᵀ · global_e) for the rows of each expert (offsets on the device).
  // x [m_total, K] bf16, y [m_total, N or N/2] bf16; m_total <= the upload's max_rows.
  virtual void run(cuda::Epilogue epilogue, const void* x, const int32_t* offsets, const float* row_scale, void* y,
                   int64_t m_total, void* workspace, cudaStream_t stream) const = 0;
  virtual size_t workspace_bytes() const = 0;
  virtual std::string describe() const = 0;              // the path, e.g. "generic 128x64x64"
  virtual std::string config_for(int64_t m_total) const = 0;  // the config a call of m_total rows runs
  size_t weight_bytes_per_expert() const { return bytes_per_expert_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }

 protected:
  size_t bytes_per_expert_ = 0;
  int64_t n_ = 0, k_ = 0;
};

// Uploads `stack` for the given epilogue (layouts may depend on it) and up to max_rows
// rows per call (rows_per_token: top_k for routed experts, 1 for the shared one; it turns
// rows into the tuner's tokens). Throws fp4moe::Error when no GEMM path can run it.
std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const ExpertStack& stack, cuda::Epilogue epilogue,
                                                      int64_t max_rows, int rows_per_token,
                                                      MoeGemmPath path = MoeGemmPath::Auto, bool w4a4 = false);

// The folded form: the experts of several stacks (same format, N, K) as ONE weight set, in
// order (routed experts, then the shared expert's pieces: shared_fold.hpp). The last
// `always_hit` experts get one row per token (rows_per_token counts them: top_k + n_sh);
// the config choice uses it (tuner bucket = m_total / rows_per_token; rows per hit expert
// from the routed rows spread over the routed experts, plus the always-hit ones).
std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const std::vector<const ExpertStack*>& stacks,
                                                      cuda::Epilogue epilogue, int64_t max_rows, int rows_per_token,
                                                      int always_hit, MoeGemmPath path = MoeGemmPath::Auto,
                                                      bool w4a4 = false);

}  // namespace moe
}  // namespace fp4moe
