// Host side of the Blackwell NVFP4 grouped GEMM (moe_gemm_sm1xx.hpp): weight re-layout and
// upload, checks, workspace, and one call's orchestration. Compiled, not run.
#include "cuda/moe_gemm_sm1xx/moe_gemm_sm1xx.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/threads.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/moe_gemm_sm1xx/nvfp4_act_quant.hpp"

namespace fp4moe::cuda {

using sm1xx::BsKernel;
using sm1xx::BsRecipe;

std::string Sm1xxConfig::name() const {
  return fmt::format("{} {}x{}x{}", sm1xx::recipe_name(recipe), tile_m, tile_n, tile_k);
}

// ---- weights ----

DeviceBsWeights::~DeviceBsWeights() {
  if (codes) cudaFree(codes);
  if (sf) cudaFree(sf);
  if (global_scale) cudaFree(global_scale);
}

DeviceBsWeights::DeviceBsWeights(DeviceBsWeights&& o) noexcept { *this = std::move(o); }

DeviceBsWeights& DeviceBsWeights::operator=(DeviceBsWeights&& o) noexcept {
  if (this != &o) {
    this->~DeviceBsWeights();
    num_experts = o.num_experts;
    n = o.n;
    k = o.k;
    codes = std::exchange(o.codes, nullptr);
    sf = std::exchange(o.sf, nullptr);
    global_scale = std::exchange(o.global_scale, nullptr);
  }
  return *this;
}

size_t DeviceBsWeights::bytes() const {
  return size_t(num_experts) * (size_t(n) * size_t(k / 2) + size_t(sm1xx::sf_bytes(n, k)) + 4);
}

namespace {

void check_weights(const ExpertStack& w) {
  FP4MOE_CHECK(w.format == WeightFormat::NVFP4, "sm1xx upload: the block-scaled kernels take NVFP4 weights, not {}",
               weight_format_name(w.format));
  FP4MOE_CHECK(w.num_experts >= 1 && w.n > 0 && w.k > 0, "sm1xx upload: empty stack (E {}, N {}, K {})", w.num_experts,
               w.n, w.k);
  FP4MOE_CHECK(w.k % 128 == 0, "sm1xx upload: K = {} is not a multiple of 128", w.k);
  FP4MOE_CHECK(w.n % 8 == 0, "sm1xx upload: N = {} is not a multiple of 8 (16-byte BF16 rows)", w.n);
  FP4MOE_CHECK(w.packed.size() == size_t(w.num_experts * w.n * w.k / 2) &&
                   w.scales.size() == size_t(w.num_experts * w.n * w.k / 16) &&
                   w.global_scale.size() == size_t(w.num_experts),
               "sm1xx upload: the stack's arrays do not match E {} x N {} x K {}", w.num_experts, w.n, w.k);
}

}  // namespace

std::vector<uint8_t> swizzle_weight_sf_sm1xx(const ExpertStack& w) {
  check_weights(w);
  const int64_t kb_n = w.k / sm1xx::kSfVec, per_expert = sm1xx::sf_bytes(w.n, w.k);
  std::vector<uint8_t> out(size_t(w.num_experts * per_expert), 0);
  parallel_for(w.num_experts * w.n, default_num_threads(), 256, [&](int64_t begin, int64_t end) {
    for (int64_t er = begin; er < end; ++er) {
      const int64_t e = er / w.n, row = er % w.n;
      const uint8_t* src = w.scales.data() + er * kb_n;
      uint8_t* dst = out.data() + e * per_expert;
      for (int64_t kb = 0; kb < kb_n; ++kb) dst[sm1xx::sf_offset(row, kb, w.k)] = src[kb];
    }
  });
  return out;
}

DeviceBsWeights upload_weights_sm1xx(const ExpertStack& w, cudaStream_t stream) {
  return upload_weights_sm1xx(std::vector<const ExpertStack*>{&w}, stream);
}

DeviceBsWeights upload_weights_sm1xx(const std::vector<const ExpertStack*>& stacks, cudaStream_t stream) {
  FP4MOE_CHECK(!stacks.empty() && stacks.front(), "sm1xx upload: no expert stacks");
  const ExpertStack& w0 = *stacks.front();
  DeviceBsWeights d;
  d.n = int(w0.n);
  d.k = int(w0.k);
  size_t codes = 0, sf = 0;
  for (const ExpertStack* w : stacks) {
    FP4MOE_CHECK(w && w->format == w0.format && w->n == w0.n && w->k == w0.k, "sm1xx upload: the stacks differ");
    check_weights(*w);
    d.num_experts += int(w->num_experts);
    codes += w->packed.size();
    sf += size_t(w->num_experts * sm1xx::sf_bytes(w->n, w->k));
  }
  FP4MOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d.codes), codes));
  FP4MOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d.sf), sf));
  FP4MOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d.global_scale), size_t(d.num_experts) * sizeof(float)));
  size_t at_codes = 0, at_sf = 0, at_e = 0;
  for (const ExpertStack* w : stacks) {
    const std::vector<uint8_t> w_sf = swizzle_weight_sf_sm1xx(*w);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d.codes + at_codes, w->packed.data(), w->packed.size(), cudaMemcpyHostToDevice, stream));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d.sf + at_sf, w_sf.data(), w_sf.size(), cudaMemcpyHostToDevice, stream));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d.global_scale + at_e, w->global_scale.data(), w->global_scale.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // w_sf dies here
    at_codes += w->packed.size();
    at_sf += w_sf.size();
    at_e += w->global_scale.size();
  }
  return d;
}

// ---- configs and checks ----

namespace {

const BsKernel* find_kernel(const Sm1xxConfig& c) {
  for (const BsKernel& k : sm1xx::bs_kernels())
    if (k.facts.recipe == c.recipe && k.facts.tile_m == c.tile_m && k.facts.tile_n == c.tile_n &&
        k.facts.tile_k == c.tile_k)
      return &k;
  return nullptr;
}

bool slabs(const Sm1xxConfig& c) { return c.recipe == BsRecipe::Sm100MoeDecode; }

int slab_depth(const MoeGemmDesc& d, int max_rows_per_expert) {
  return max_rows_per_expert > 0 ? max_rows_per_expert : d.max_tokens;
}

}  // namespace

std::vector<Sm1xxConfig> sm1xx_configs(int cc) {
  std::vector<Sm1xxConfig> out;
  for (const BsKernel& k : sm1xx::bs_kernels())
    if (sm1xx::recipe_cc(k.facts.recipe) == cc)
      out.push_back({k.facts.recipe, k.facts.tile_m, k.facts.tile_n, k.facts.tile_k});
  return out;
}

std::string sm1xx_can_implement(const MoeGemmDesc& d, const Sm1xxConfig& c, int cc, int max_rows_per_expert) {
  const BsKernel* k = find_kernel(c);
  if (!k)
    return fmt::format("{} is not compiled into this build (CMAKE_CUDA_ARCHITECTURES needs {}a)", c.name(),
                       sm1xx::recipe_cc(c.recipe));
  if (cc != sm1xx::recipe_cc(c.recipe))
    return fmt::format("{} needs sm_{} ({}); this GPU is sm_{}", c.name(), sm1xx::recipe_cc(c.recipe),
                       c.recipe == BsRecipe::Sm120Grouped ? "mma.sync block_scale" : "tcgen05", cc);
  if (d.weight != WeightFormat::NVFP4)
    return fmt::format("{} takes NVFP4 weights, not {}", c.name(), weight_format_name(d.weight));
  if (d.act != ActFormat::NVFP4_EMULATED)
    return fmt::format("{} computes W4A4 (activations quantized to NVFP4); this problem is W4A16", c.name());
  if (d.num_experts < 1) return fmt::format("num_experts = {} (need >= 1)", d.num_experts);
  if (d.k <= 0 || d.k % 128 != 0) return fmt::format("K = {} is not a positive multiple of 128", d.k);
  if (d.n <= 0 || d.n % 8 != 0) return fmt::format("N = {} is not a positive multiple of 8", d.n);
  if (d.epilogue == Epilogue::SiluMul && d.n % 16 != 0)
    return fmt::format("SiluMul needs N = 2I with I a multiple of 8 (N = {})", d.n);
  if (d.max_tokens < 0) return fmt::format("max_tokens = {} is negative", d.max_tokens);
  const int depth = slab_depth(d, max_rows_per_expert);
  // CUTLASS's own check on the largest group this call can see.
  const int32_t rows = slabs(c) ? depth : std::max(d.max_tokens, 1);
  const std::string why = k->can_implement(d.n, d.k, &rows, 1, depth);
  if (!why.empty()) return fmt::format("{}: CUTLASS can_implement refuses N {} x M {} x K {}: {}", c.name(), d.n, rows, d.k, why);
  return {};
}

sm1xx::BsWorkspaceLayout sm1xx_workspace_layout(const MoeGemmDesc& d, const Sm1xxConfig& c, int sm_count,
                                                int max_rows_per_expert) {
  const BsKernel* k = find_kernel(c);
  FP4MOE_CHECK(k, "{} is not compiled into this build", c.name());
  FP4MOE_CHECK(sm_count > 0, "sm1xx workspace: SM count {} (need > 0)", sm_count);
  const int64_t E = d.num_experts, N = d.n;
  const int depth = slab_depth(d, max_rows_per_expert);
  const int64_t rows = slabs(c) ? E * depth : d.max_tokens;
  const int64_t sf_rows = slabs(c) ? E * sm1xx::sf_rows(depth) : sm1xx::act_sf_rows_bound(d.max_tokens, E);
  const bool wide = slabs(c) || d.epilogue == Epilogue::SiluMul;  // the GEMM output stays in the workspace
  const int64_t out_bytes = wide ? rows * N * 2 : 0;
  return sm1xx::bs_workspace_layout(E, rows, sf_rows, d.k, k->arg_sizes, out_bytes,
                                    int64_t(k->cutlass_workspace_bytes(int(E), sm_count, depth)));
}

// ---- one call ----

void run_moe_gemm_sm1xx(const MoeGemmDesc& d, const Sm1xxConfig& c, const DeviceBsWeights& w, const MoeGemmArgs& a,
                        int max_rows_per_expert) {
  const DeviceInfo& dev = current_device();
  const int device = dev.ordinal;
  const std::string why = sm1xx_can_implement(d, c, dev.cc, max_rows_per_expert);
  FP4MOE_CHECK(why.empty(), "run_moe_gemm_sm1xx: {}", why);
  FP4MOE_CHECK(w.num_experts == d.num_experts && w.n == d.n && w.k == d.k,
               "run_moe_gemm_sm1xx: weights are E {} x N {} x K {}, the problem E {} x N {} x K {}", w.num_experts, w.n,
               w.k, d.num_experts, d.n, d.k);
  const int begin = a.expert_begin, end = a.expert_end < 0 ? d.num_experts : a.expert_end;
  FP4MOE_CHECK(0 <= begin && begin <= end && end <= d.num_experts, "run_moe_gemm_sm1xx: experts [{}, {}) of {}", begin,
               end, d.num_experts);
  FP4MOE_CHECK(a.m_total >= 0 && a.m_total <= d.max_tokens, "run_moe_gemm_sm1xx: m_total {} exceeds max_tokens {}",
               a.m_total, d.max_tokens);
  FP4MOE_CHECK(a.x && a.y && a.expert_offsets && a.workspace, "run_moe_gemm_sm1xx: null x, y, offsets or workspace");
  FP4MOE_CHECK(d.epilogue != Epilogue::RowScale || a.row_scale, "run_moe_gemm_sm1xx: RowScale needs row_scale");
  if (begin == end || a.m_total == 0) return;

  const int sm_count = dev.sm_count;
  const sm1xx::BsWorkspaceLayout L = sm1xx_workspace_layout(d, c, sm_count, max_rows_per_expert);
  char* ws = static_cast<char*>(a.workspace);
  const bool slab = slabs(c), wide = slab || d.epilogue == Epilogue::SiluMul;
  const int depth = slab ? slab_depth(d, max_rows_per_expert) : 0;

  const float* act_global = a.act_global_scale;
  if (!act_global) {
    compute_act_global_scale(a.x, a.m_total, d.k, reinterpret_cast<float*>(ws + L.act_global), a.stream);
    act_global = reinterpret_cast<const float*>(ws + L.act_global);
  }
  sm1xx::ActQuantArgs q;
  q.x = a.x;
  q.rows = a.m_total;
  q.k = d.k;
  q.offsets = a.expert_offsets;
  q.expert_begin = begin;
  q.expert_end = end;
  q.global = act_global;
  q.out_fp4 = reinterpret_cast<uint8_t*>(ws + L.act_fp4);
  q.out_sf = reinterpret_cast<uint8_t*>(ws + L.act_sf);
  q.max_n = depth;
  sm1xx::quantize_act_nvfp4(q, a.stream);

  sm1xx::BsLaunch l;
  l.in.n = d.n;
  l.in.k = d.k;
  l.in.groups = end - begin;
  l.in.expert_begin = begin;
  l.in.offsets = a.expert_offsets;
  l.in.max_n = depth;
  l.in.w = reinterpret_cast<uint64_t>(w.codes);
  l.in.w_sf = reinterpret_cast<uint64_t>(w.sf);
  l.in.x = reinterpret_cast<uint64_t>(q.out_fp4);
  l.in.x_sf = reinterpret_cast<uint64_t>(q.out_sf);
  l.in.y = reinterpret_cast<uint64_t>(wide ? static_cast<void*>(ws + L.out) : a.y);
  l.w_global = w.global_scale;
  l.act_global = act_global;
  l.workspace = a.workspace;
  l.ws_layout = L;
  l.sm_count = sm_count;
  l.device = device;
  l.stream = a.stream;
  const std::string err = find_kernel(c)->run(l);
  FP4MOE_CHECK(err.empty(), "run_moe_gemm_sm1xx {}: {}", c.name(), err);

  if (wide || d.epilogue == Epilogue::RowScale) {
    sm1xx::RowGatherArgs g;
    g.src = wide ? static_cast<const void*>(ws + L.out) : a.y;
    g.y = a.y;
    g.rows = a.m_total;
    g.n = d.epilogue == Epilogue::SiluMul ? d.n / 2 : d.n;
    g.offsets = a.expert_offsets;
    g.expert_begin = begin;
    g.expert_end = end;
    g.row_scale = d.epilogue == Epilogue::RowScale ? a.row_scale : nullptr;
    g.max_n = depth;
    g.silu_mul = d.epilogue == Epilogue::SiluMul;
    sm1xx::gather_scale_rows_bf16(g, a.stream);
  }
}

}  // namespace fp4moe::cuda
