// The one place the MoE layer calls a grouped expert GEMM: the switch between the GEMM
// paths of cuda/moe_gemm/ (the sm_90a kernels on the re-laid layout, GemmKernel::Generic on
// the linear checkpoint layout). Weights are uploaded in the layout of the chosen path, and
// the tile config of every tokens bucket is chosen once, at upload: run() only looks it up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/moe_gemm/moe_gemm.hpp"
#include "format/moe_layer.hpp"

namespace fp4moe {

// Which grouped GEMM the MoE layer runs. Auto follows the device's compute capability through
// the tuner's arch -> family table (tuner/moe_gemm_family.hpp): sm_90 -> Sm90, sm_100 / sm_120
// -> Sm1xx (W4A4, compiled, not run), others -> Generic; a device this binary has no code for
// is refused with one line.
enum class MoeGemmPath : uint8_t { Auto, Generic, Sm90, Sm1xx };
const char* moe_gemm_path_name(MoeGemmPath p);  // "auto" | "generic" | "sm90" | "sm1xx"
// "auto" | "generic" | "sm90" | "sm1xx" -> the path; throws fp4moe::Error naming `what` otherwise.
MoeGemmPath moe_gemm_path_from_name(std::string_view s, std::string_view what);

namespace cuda {
class StagedUpload;
}

namespace moe {

// Tokens buckets: bucket b holds T in (2^(b-1), 2^b] (bucket 0: T = 1), the tuner's buckets.
int tokens_bucket_index(int64_t tokens);

class ExpertGemmWeights {
 public:
  virtual ~ExpertGemmWeights() = default;
  // y = epilogue(x · W_eᵀ · global_e) for the rows of each expert (offsets on the device) of a
  // batch of `tokens` tokens: m_total = tokens · rows_per_token rows. x [m_total, K] bf16,
  // y [m_total, N or N/2] bf16; tokens <= the upload's max_tokens. Enqueue only: the bucket's
  // config was resolved at upload; no allocation, no formatting, no file or environment access.
  virtual void run(cuda::Epilogue epilogue, const void* x, const int32_t* offsets, const float* row_scale, void* y,
                   int64_t tokens, void* workspace, cudaStream_t stream) const = 0;
  virtual size_t workspace_bytes() const = 0;
  virtual std::string describe() const = 0;                   // the path, e.g. "generic 128x64x64"
  virtual std::string config_for(int64_t tokens) const = 0;   // the config(s) a call of `tokens` runs
  size_t weight_bytes_per_expert() const { return bytes_per_expert_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int rows_per_token() const { return rows_per_token_; }

 protected:
  size_t bytes_per_expert_ = 0;
  int64_t n_ = 0, k_ = 0;
  int rows_per_token_ = 1;
};

// Uploads the experts of `stacks` (one stack, or several of one format, N and K as ONE weight
// set, in order: the routed experts, then the shared expert's pieces, shared_fold.hpp) for the
// given epilogue (layouts may depend on it) and batches of up to max_tokens tokens.
// rows_per_token: rows each token has in the GEMM (top_k, + n_sh when folded; 1 for a separate
// shared expert); the last `always_hit` experts get one row per token (the folded pieces).
// The config choice per bucket uses them: the tuned plan of the bucket (for a folded set its
// own entry, else the routed-only problem's), else cuda::default_config from the expected rows
// per hit routed expert. Throws fp4moe::Error when no GEMM path can run it.
// Stacks may be owned or view mode (the mmap'd checkpoint): the sm90 path re-lays views per
// tile straight into `staging`'s pinned buffers (null: a temporary one); the others make an
// owned copy first (owned_expert_stack).
std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const std::vector<const ExpertStack*>& stacks,
                                                      cuda::Epilogue epilogue, int64_t max_tokens, int rows_per_token,
                                                      int always_hit = 0, MoeGemmPath path = MoeGemmPath::Auto,
                                                      bool w4a4 = false, cuda::StagedUpload* staging = nullptr);

}  // namespace moe
}  // namespace fp4moe
