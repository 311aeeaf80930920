// GemmKernel::DequantCublas, host side: validation, workspaces, cuBLASLt / grouped cuBLAS
// calls (kernels in dequant_cublas.cu). See dequant_cublas.hpp.
#include "cuda/moe_gemm/dequant_cublas.hpp"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/moe_gemm/linear_fp4_kernels.hpp"

namespace fp4moe::cuda {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

}  // namespace

const char* dequant_cublas_mode_name(DequantCublasOptions::Mode m) {
  return m == DequantCublasOptions::Mode::CublasLt ? "cublaslt" : "grouped";
}

std::string dequant_cublas_can_implement(const MoeGemmDesc& d, const LinearFp4Weights& w) {
  if (d.weight == WeightFormat::BF16) return "DequantCublas needs FP4 weights (NVFP4 or MXFP4), got bf16";
  if (d.act != ActFormat::BF16) return "DequantCublas computes W4A16 only (no NVFP4 activation emulation)";
  if (d.num_experts <= 0 || d.n <= 0 || d.k <= 0)
    return fmt::format("bad shape E={} N={} K={}", d.num_experts, d.n, d.k);
  const int block = d.weight == WeightFormat::MXFP4 ? 32 : 16;
  if (d.k % block != 0)
    return fmt::format("K={} is not a multiple of the {} block size {}", d.k, weight_format_name(d.weight), block);
  if (d.n % 8 != 0) return fmt::format("N={} is not a multiple of 8 (cuBLAS 16-byte row alignment)", d.n);
  if (d.epilogue == Epilogue::SiluMul && d.n % 2 != 0)
    return fmt::format("SiluMul needs an even N (gate and up halves), got N={}", d.n);
  if (d.epilogue == Epilogue::SiluMul && d.max_tokens <= 0)
    return "SiluMul needs desc.max_tokens > 0 (it sizes the BF16 intermediate)";
  if (w.packed != nullptr || w.n != 0) return linear_weights_mismatch(d, w);  // weights given: they must match
  return {};
}

struct DequantCublasGemm::Impl {
  DequantCublasOptions opt;
  int slots = 0;
  size_t bytes = 0;
  DeviceBuffer wbf16;          // [slots, N, K] bf16
  DeviceBuffer inter;          // [max_tokens, N] bf16 (SiluMul only)
  DeviceBuffer lt_ws;          // cuBLAS(Lt) workspace
  DeviceBuffer consts;         // f32 {0 (beta), 1 (alpha without globals)}
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t mm = nullptr;
  cublasLtMatrixLayout_t layout_w = nullptr;  // K x N col-major (= W [N, K] row-major), op T
  cublasLtMatmulPreference_t pref = nullptr;
  struct Plan {
    cublasLtMatrixLayout_t x = nullptr, y = nullptr;  // K x M, N x M col-major
    cublasLtMatmulAlgo_t algo{};
  };
  std::unordered_map<int, Plan> plans;  // by M
  cublasHandle_t blas = nullptr;        // GroupedBatched
  DeviceBuffer dev_ptrs;                // [2][3, E] device pointer arrays (A, B, C), per run parity
  void** host_ptrs = nullptr;           // [2][3, E] pinned staging, per run parity
  cudaEvent_t staging_done[2] = {nullptr, nullptr};  // after the last H2D copy of a run
  int parity = 0;
  int32_t* host_offsets = nullptr;      // [E+1] pinned (fallback D2H copy)

  const Plan& plan(const MoeGemmDesc& d, int m) {
    auto it = plans.find(m);
    if (it != plans.end()) return it->second;
    Plan p;
    FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.x, CUDA_R_16BF, uint64_t(d.k), uint64_t(m), d.k));
    FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.y, CUDA_R_16BF, uint64_t(d.n), uint64_t(m), d.n));
    cublasLtMatmulHeuristicResult_t res{};
    int count = 0;
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, mm, layout_w, p.x, p.y, p.y, pref, 1, &res, &count));
    FP4MOE_CHECK(count > 0, "cuBLASLt has no algorithm for BF16 [{} x {}] x [{} x {}]", m, d.k, d.k, d.n);
    p.algo = res.algo;
    return plans.emplace(m, p).first->second;
  }

  ~Impl() {
    for (auto& [m, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.x);
      cublasLtMatrixLayoutDestroy(p.y);
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (layout_w) cublasLtMatrixLayoutDestroy(layout_w);
    if (mm) cublasLtMatmulDescDestroy(mm);
    if (lt) cublasLtDestroy(lt);
    if (blas) cublasDestroy(blas);
    for (cudaEvent_t e : staging_done)
      if (e) cudaEventDestroy(e);
    if (host_ptrs) cudaFreeHost(host_ptrs);
    if (host_offsets) cudaFreeHost(host_offsets);
  }
};

DequantCublasGemm::DequantCublasGemm(const MoeGemmDesc& d, DequantCublasOptions opt)
    : desc_(d), impl_(std::make_unique<Impl>()) {
  if (std::string why = dequant_cublas_can_implement(d, {}); !why.empty())
    FP4MOE_FAIL("DequantCublas: {}", why);
  Impl& s = *impl_;
  s.opt = opt;
  const size_t expert_bytes = size_t(d.n) * size_t(d.k) * 2;
  const size_t fit = std::max<size_t>(1, opt.max_dequant_bytes / expert_bytes);
  s.slots = int(std::min<size_t>({fit, size_t(d.num_experts), size_t(linear_fp4::kMaxDequantSlots)}));
  s.wbf16 = DeviceBuffer(expert_bytes * size_t(s.slots));
  s.bytes = expert_bytes * size_t(s.slots) + kLtWorkspaceBytes + 16;
  if (d.epilogue == Epilogue::SiluMul) {
    const size_t b = size_t(d.max_tokens) * size_t(d.n) * 2;
    s.inter = DeviceBuffer(b);
    s.bytes += b;
  }
  s.lt_ws = DeviceBuffer(kLtWorkspaceBytes);
  s.consts = DeviceBuffer::from(std::vector<float>{0.0f, 1.0f});
  FP4MOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.host_offsets), size_t(d.num_experts + 1) * sizeof(int32_t)));

  if (opt.mode == DequantCublasOptions::Mode::CublasLt) {
    FP4MOE_CUBLAS_CHECK(cublasLtCreate(&s.lt));
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&s.mm, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.mm, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.mm, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.mm, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
    FP4MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.layout_w, CUDA_R_16BF, uint64_t(d.k), uint64_t(d.n), d.k));
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&s.pref));
    const uint64_t ws = kLtWorkspaceBytes;
    FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t align = 16;  // expert row offsets keep 16-byte alignment only (N, K % 8 == 0)
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      FP4MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(s.pref, attr, &align, sizeof(align)));
  } else {
    FP4MOE_CUBLAS_CHECK(cublasCreate(&s.blas));
    FP4MOE_CUBLAS_CHECK(cublasSetWorkspace(s.blas, s.lt_ws.ptr(), kLtWorkspaceBytes));
    s.dev_ptrs = DeviceBuffer(6 * size_t(d.num_experts) * sizeof(void*));
    FP4MOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.host_ptrs), 6 * size_t(d.num_experts) * sizeof(void*)));
    for (cudaEvent_t& e : s.staging_done) FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
}

DequantCublasGemm::~DequantCublasGemm() = default;

int DequantCublasGemm::slots() const { return impl_->slots; }
size_t DequantCublasGemm::device_bytes() const { return impl_->bytes; }

TileConfig DequantCublasGemm::tile_config() const {
  TileConfig c;
  c.kernel = GemmKernel::DequantCublas;
  c.block_m = impl_->slots;  // experts dequantized per chunk
  c.stages = impl_->opt.mode == DequantCublasOptions::Mode::CublasLt ? 1 : 2;  // 1: cuBLASLt, 2: grouped
  return c;
}

void DequantCublasGemm::run(const LinearFp4Weights& w, const MoeGemmArgs& a,
                            std::span<const int32_t> host_offsets) {
  const MoeGemmDesc& d = desc_;
  Impl& s = *impl_;
  if (std::string why = dequant_cublas_can_implement(d, w); !why.empty()) FP4MOE_FAIL("DequantCublas: {}", why);
  FP4MOE_CHECK(a.x && a.expert_offsets && a.y && w.packed && w.scales,
               "DequantCublas: null x / expert_offsets / y / weight pointer");
  FP4MOE_CHECK(aligned(a.x, 16) && aligned(a.y, 16), "DequantCublas: x and y must be 16-byte aligned");
  FP4MOE_CHECK(aligned(w.packed, 8), "DequantCublas: packed weights must be 8-byte aligned");
  FP4MOE_CHECK(d.epilogue != Epilogue::RowScale || a.row_scale, "DequantCublas: Epilogue::RowScale needs row_scale");
  FP4MOE_CHECK(a.m_total >= 0 && (d.max_tokens == 0 || a.m_total <= d.max_tokens),
               "DequantCublas: m_total={} exceeds max_tokens={}", a.m_total, d.max_tokens);
  const bool grouped = s.opt.mode == DequantCublasOptions::Mode::GroupedBatched;
  FP4MOE_CHECK(!grouped || w.global_scale_host || !w.global_scale,
               "DequantCublas grouped mode needs the host copy of the global scales");
  if (a.m_total == 0) return;

  const int E = d.num_experts;
  std::span<const int32_t> off = host_offsets;
  if (off.empty()) {  // the documented host synchronisation
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(s.host_offsets, a.expert_offsets, size_t(E + 1) * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, a.stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(a.stream));
    off = {s.host_offsets, size_t(E + 1)};
  }
  FP4MOE_CHECK(off.size() == size_t(E + 1), "DequantCublas: {} host offsets, expected E+1 = {}", off.size(), E + 1);
  for (int e = 0; e < E; ++e)
    FP4MOE_CHECK(off[e] >= 0 && off[e] <= off[e + 1], "DequantCublas: expert offsets not monotone at {}", e);
  FP4MOE_CHECK(off[E] <= a.m_total, "DequantCublas: offsets end at {} > m_total {}", off[E], a.m_total);

  std::vector<int> hits;
  for (int e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) hits.push_back(e);
  const bool silu = d.epilogue == Epilogue::SiluMul;
  auto* out = static_cast<uint8_t*>(silu ? s.inter.ptr() : a.y);  // [M_total, N] bf16
  const auto* x = static_cast<const uint8_t*>(a.x);
  const size_t expert_elems = size_t(d.n) * size_t(d.k);
  // Grouped mode: this run's staging half was last read by the run before the previous one;
  // waiting for its copies does not serialise the host with the GPU work just enqueued.
  const size_t stage0 = size_t(s.parity) * 3 * size_t(E);
  if (grouped) FP4MOE_CUDA_CHECK(cudaEventSynchronize(s.staging_done[s.parity]));

  for (size_t c0 = 0; c0 < hits.size(); c0 += size_t(s.slots)) {
    const int count = int(std::min(hits.size() - c0, size_t(s.slots)));
    linear_fp4::DequantParams dp;
    dp.packed = w.packed;
    dp.scales = w.scales;
    dp.out = s.wbf16.ptr();
    dp.n = d.n;
    dp.k = d.k;
    dp.slots = count;
    dp.mx = d.weight == WeightFormat::MXFP4;
    for (int i = 0; i < count; ++i) dp.experts[i] = hits[c0 + size_t(i)];
    FP4MOE_CUDA_CHECK(linear_fp4::launch_dequant_experts(dp, a.stream));

    if (!grouped) {
      for (int i = 0; i < count; ++i) {
        const int e = hits[c0 + size_t(i)];
        const int m = off[e + 1] - off[e];
        const Impl::Plan& p = s.plan(d, m);
        const float* alpha = w.global_scale ? w.global_scale + e : s.consts.as<float>() + 1;
        const void* wb = s.wbf16.as<const uint8_t>() + size_t(i) * expert_elems * 2;
        const void* xb = x + size_t(off[e]) * size_t(d.k) * 2;
        void* yb = out + size_t(off[e]) * size_t(d.n) * 2;
        FP4MOE_CUBLAS_CHECK(cublasLtMatmul(s.lt, s.mm, alpha, wb, s.layout_w, xb, p.x, s.consts.as<float>(), yb, p.y, yb,
                                           p.y, &p.algo, s.lt_ws.ptr(), kLtWorkspaceBytes, a.stream));
      }
    } else {
      // Host arrays of the grouped call: one group per expert (group_size 1).
      std::vector<cublasOperation_t> ta(size_t(count), CUBLAS_OP_T), tb(size_t(count), CUBLAS_OP_N);
      const size_t cnt = size_t(count);
      std::vector<int> mv(cnt, d.n), nv(cnt, 0), kv(cnt, d.k);
      std::vector<int> lda(size_t(count), d.k), ldb(size_t(count), d.k), ldc(size_t(count), d.n);
      std::vector<int> group_size(size_t(count), 1);
      std::vector<float> alpha(cnt, 1.0f), beta(cnt, 0.0f);
      void** hp = s.host_ptrs + stage0 + 3 * c0;
      for (int i = 0; i < count; ++i) {
        const int e = hits[c0 + size_t(i)];
        nv[size_t(i)] = off[e + 1] - off[e];
        alpha[size_t(i)] = w.global_scale_host ? w.global_scale_host[e] : 1.0f;
        hp[i] = s.wbf16.as<uint8_t>() + size_t(i) * expert_elems * 2;
        hp[count + i] = const_cast<uint8_t*>(x) + size_t(off[e]) * size_t(d.k) * 2;
        hp[2 * count + i] = out + size_t(off[e]) * size_t(d.n) * 2;
      }
      void** dp_ptrs = s.dev_ptrs.as<void*>() + stage0 + 3 * c0;
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(dp_ptrs, hp, 3 * size_t(count) * sizeof(void*), cudaMemcpyHostToDevice,
                                        a.stream));
      FP4MOE_CUBLAS_CHECK(cublasSetStream(s.blas, a.stream));
      FP4MOE_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
          s.blas, ta.data(), tb.data(), mv.data(), nv.data(), kv.data(), alpha.data(), dp_ptrs, CUDA_R_16BF,
          lda.data(), dp_ptrs + count, CUDA_R_16BF, ldb.data(), beta.data(), dp_ptrs + 2 * count, CUDA_R_16BF,
          ldc.data(), count, group_size.data(), CUBLAS_COMPUTE_32F));
    }
  }
  if (grouped) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(s.staging_done[s.parity], a.stream));
    s.parity ^= 1;
  }

  if (silu) {
    FP4MOE_CUDA_CHECK(linear_fp4::launch_silu_mul_rows(s.inter.ptr(), a.y, off[0], off[E], d.n / 2, a.stream));
  } else if (d.epilogue == Epilogue::RowScale) {
    FP4MOE_CUDA_CHECK(linear_fp4::launch_row_scale_rows(a.y, a.row_scale, off[0], off[E], d.n, a.stream));
  }
}

}  // namespace fp4moe::cuda
