// The GEMM switch of the MoE layer (see expert_gemm.hpp).
//
// Path today: GemmKernel::Generic (cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp), linear
// checkpoint layout, device-side offsets, no workspace, graph-capturable.
#include "moe/expert_gemm.hpp"

#include "core/error.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"

namespace fp4moe::moe {

namespace {

class GenericExpertGemm final : public ExpertGemmWeights {
 public:
  GenericExpertGemm(const ExpertStack& s, cuda::Epilogue ep, int64_t max_rows) : dev_(s) {
    bytes_per_expert_ = s.weight_bytes_per_expert();
    n_ = s.n;
    k_ = s.k;
    const std::string why = cuda::generic_can_implement(desc(ep, max_rows), dev_.view());
    FP4MOE_CHECK(why.empty(), "expert GEMM [{}, {}, {}]: {}", s.num_experts, s.n, s.k, why);
  }

  void run(cuda::Epilogue ep, const void* x, const int32_t* offsets, const float* row_scale, void* y,
           int64_t m_total, int64_t max_rows, void* workspace, cudaStream_t stream) const override {
    cuda::MoeGemmArgs a;
    a.x = x;
    a.expert_offsets = offsets;
    a.row_scale = row_scale;
    a.y = y;
    a.m_total = int(m_total);
    a.workspace = workspace;
    a.stream = stream;
    cuda::run_generic_grouped_gemm(desc(ep, max_rows), dev_.view(), a);
  }
  size_t workspace_bytes() const override { return 0; }
  std::string describe() const override { return "generic " + cuda::to_string(cuda::generic_tile_config()); }

 private:
  cuda::MoeGemmDesc desc(cuda::Epilogue ep, int64_t max_rows) const {
    cuda::MoeGemmDesc d;
    d.num_experts = dev_.view().num_experts;
    d.n = dev_.view().n;
    d.k = dev_.view().k;
    d.max_tokens = int(max_rows);
    d.weight = dev_.view().format;
    d.act = cuda::ActFormat::BF16;
    d.epilogue = ep;
    return d;
  }
  cuda::DeviceLinearFp4Weights dev_;
};

}  // namespace

std::unique_ptr<ExpertGemmWeights> upload_expert_gemm(const ExpertStack& stack, cuda::Epilogue epilogue,
                                                      int64_t max_rows) {
  FP4MOE_CHECK(stack.is_fp4(), "expert GEMM: FP4 weights needed, got {}", weight_format_name(stack.format));
  FP4MOE_CHECK(max_rows >= 1 && max_rows < (int64_t(1) << 31), "expert GEMM: max_rows = {}", max_rows);
  return std::make_unique<GenericExpertGemm>(stack, epilogue, max_rows);
}

}  // namespace fp4moe::moe
