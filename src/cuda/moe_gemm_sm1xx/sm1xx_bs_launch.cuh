// One template behind every Blackwell instantiation (sm120_/sm100_nvfp4_grouped_gemm_*.cu):
// the per-group argument builder (one __host__ __device__ function: the device kernel writes
// the workspace arrays with it, the host twin lets the tests read what it wrote), CUTLASS's
// can_implement / get_workspace_size on host problem shapes (no GPU needed), and the launch.
// A recipe R (sm120_nvfp4_bs_recipe.cuh, sm100_nvfp4_bs_recipe.cuh) provides the CUTLASS types.
// Compiled, not run.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include <cutlass/util/packed_stride.hpp>

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_facts.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"

namespace fp4moe::cuda::sm1xx {

// The per-group CUTLASS types of recipe R. Grouped (ptr-array) kernels take arrays of them;
// the slab (MoE decode) kernel takes one of each for the whole [*, *, E] tensor.
template <class R, bool kSlabs = R::kSlabs>
struct ArgTypes {
  using Shape = typename R::ProblemShape::UnderlyingProblemShape;
  using StrideA = typename R::Kernel::InternalStrideA;
  using StrideB = typename R::Kernel::InternalStrideB;
  using StrideD = typename R::Kernel::InternalStrideD;
  using LayoutSFA = typename R::Mainloop::InternalLayoutSFA;
  using LayoutSFB = typename R::Mainloop::InternalLayoutSFB;
  using ScaleConfig = typename R::Mainloop::Sm1xxBlkScaledConfig;
};
template <class R>
struct ArgTypes<R, true> {
  using Shape = typename R::ProblemShape::UnderlyingProblemShape;
  using StrideA = typename R::Kernel::StrideA;
  using StrideB = typename R::Kernel::StrideB;
  using StrideD = typename R::Kernel::StrideD;
  using LayoutSFA = typename R::Mainloop::LayoutSFA;
  using LayoutSFB = typename R::Mainloop::LayoutSFB;
  using ScaleConfig = typename R::Mainloop::Sm1xxBlkScaledConfig;
};

// Group g's arguments (expert e = expert_begin + g). Grouped recipes: pointers into the
// permuted batch (sm1xx_bs_layout.hpp); slab recipe: the slab of expert g of the call.
template <class R>
struct GroupValues {
  using T = ArgTypes<R>;
  typename T::Shape problem;
  uint64_t a, b, sfa, sfb, d;
  typename T::StrideA sa;
  typename T::StrideB sb;
  typename T::StrideD sd;
  typename T::LayoutSFA lsfa;
  typename T::LayoutSFB lsfb;
  int32_t tokens;
};

template <class R>
CUTLASS_HOST_DEVICE GroupValues<R> group_values(const BsGroupInput& in, int g) {
  using T = ArgTypes<R>;
  GroupValues<R> v;
  const int e = in.expert_begin + g;
  const int64_t off = in.offsets[e];
  const int m = int(in.offsets[e + 1] - off);
  const int n = in.n, k = in.k;
  v.problem = typename T::Shape(n, m, k);
  v.tokens = m;
  if constexpr (R::kSlabs) {
    // The whole call is one [N, max_n, K, E] problem (E = groups); group g is mode-L index g.
    const int groups = in.groups, max_n = in.max_n;
    v.sa = cutlass::make_cute_packed_stride(typename T::StrideA{}, {n, k, groups});
    v.sb = cutlass::make_cute_packed_stride(typename T::StrideB{}, {max_n, k, groups});
    v.sd = cutlass::make_cute_packed_stride(typename T::StrideD{}, {n, max_n, groups});
    v.lsfa = T::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(n, max_n, k, groups));
    v.lsfb = T::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(n, max_n, k, groups));
    const uint64_t w0 = in.w + uint64_t(in.expert_begin) * n * (k / 2);
    const uint64_t wsf0 = in.w_sf + uint64_t(in.expert_begin) * sf_bytes(n, k);
    v.a = w0 + uint64_t(int64_t(cute::get<2>(v.sa)) * g / 2);  // FP4: 2 elements per byte
    v.b = in.x + uint64_t(int64_t(cute::get<2>(v.sb)) * g / 2);
    v.d = in.y + uint64_t(int64_t(cute::get<2>(v.sd)) * g * 2);  // BF16
    v.sfa = wsf0 + uint64_t(v.lsfa(0, 0, g));
    v.sfb = in.x_sf + uint64_t(v.lsfb(0, 0, g));
  } else {
    v.sa = cutlass::make_cute_packed_stride(typename T::StrideA{}, {n, k, 1});
    v.sb = cutlass::make_cute_packed_stride(typename T::StrideB{}, {m, k, 1});
    v.sd = cutlass::make_cute_packed_stride(typename T::StrideD{}, {n, m, 1});
    v.lsfa = T::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(n, m, k, 1));
    v.lsfb = T::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(n, m, k, 1));
    v.a = in.w + uint64_t(e) * n * (k / 2);
    v.b = in.x + uint64_t(off) * (k / 2);
    v.d = in.y + uint64_t(off) * n * 2;
    v.sfa = in.w_sf + uint64_t(e) * sf_bytes(n, k);
    v.sfb = in.x_sf + uint64_t(act_sf_row_base(e, off)) * sf_cols(k);
  }
  return v;
}

// Typed views of the workspace arrays (bs_workspace_layout offsets).
template <class R>
struct ArgArrays {
  using T = ArgTypes<R>;
  typename T::Shape* problem;
  uint64_t *a, *b, *sfa, *sfb, *d;
  typename T::StrideA* sa;
  typename T::StrideB* sb;
  typename T::StrideD* sd;
  typename T::LayoutSFA* lsfa;
  typename T::LayoutSFB* lsfb;
  float* alpha;
  int32_t* tokens;
};

template <class R>
ArgArrays<R> arg_arrays(void* ws, const BsWorkspaceLayout& l) {
  using T = ArgTypes<R>;
  char* b = static_cast<char*>(ws);
  return {reinterpret_cast<typename T::Shape*>(b + l.problem_sizes),
          reinterpret_cast<uint64_t*>(b + l.ptr_a),
          reinterpret_cast<uint64_t*>(b + l.ptr_b),
          reinterpret_cast<uint64_t*>(b + l.ptr_sfa),
          reinterpret_cast<uint64_t*>(b + l.ptr_sfb),
          reinterpret_cast<uint64_t*>(b + l.ptr_d),
          reinterpret_cast<typename T::StrideA*>(b + l.stride_a),
          reinterpret_cast<typename T::StrideB*>(b + l.stride_b),
          reinterpret_cast<typename T::StrideD*>(b + l.stride_d),
          reinterpret_cast<typename T::LayoutSFA*>(b + l.layout_sfa),
          reinterpret_cast<typename T::LayoutSFB*>(b + l.layout_sfb),
          reinterpret_cast<float*>(b + l.alpha),
          reinterpret_cast<int32_t*>(b + l.tokens_per_expert)};
}

// One thread per group: its arguments and alpha = weight_scale_2[e] * input_scale.
template <class R>
__global__ void build_group_args_kernel(BsGroupInput in, ArgArrays<R> out, const float* w_global,
                                        const float* act_global) {
  const int g = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= in.groups) return;
  const GroupValues<R> v = group_values<R>(in, g);
  out.problem[g] = v.problem;
  out.a[g] = v.a;
  out.b[g] = v.b;
  out.sfa[g] = v.sfa;
  out.sfb[g] = v.sfb;
  out.d[g] = v.d;
  out.sa[g] = v.sa;
  out.sb[g] = v.sb;
  out.sd[g] = v.sd;
  out.lsfa[g] = v.lsfa;
  out.lsfb[g] = v.lsfb;
  out.tokens[g] = v.tokens;
  out.alpha[g] = w_global[in.expert_begin + g] * act_global[0];
}

// CUTLASS's Arguments for one call. Device arrays come from `arr` (null views for the host
// checks); host_problems / host_tokens: the host copies CUTLASS's checks read (or null).
template <class R>
typename R::Gemm::Arguments make_arguments(const BsGroupInput& in, const ArgArrays<R>& arr,
                                           typename ArgTypes<R>::Shape* host_problems, int32_t* host_tokens,
                                           int sm_count, int device) {
  using Args = typename R::Gemm::Arguments;
  Args args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  if constexpr (R::kSlabs) {
    args.problem_shape = typename R::ProblemShape{in.n, in.max_n, in.k, in.groups, arr.tokens, host_tokens};
    const GroupValues<R> v0 = group_values<R>(in, 0);  // strides of the whole slab tensor; group 0's base
    args.mainloop.ptr_A = reinterpret_cast<decltype(args.mainloop.ptr_A)>(v0.a);
    args.mainloop.ptr_B = reinterpret_cast<decltype(args.mainloop.ptr_B)>(v0.b);
    args.mainloop.ptr_SFA = reinterpret_cast<decltype(args.mainloop.ptr_SFA)>(v0.sfa);
    args.mainloop.ptr_SFB = reinterpret_cast<decltype(args.mainloop.ptr_SFB)>(v0.sfb);
    args.epilogue.ptr_D = reinterpret_cast<decltype(args.epilogue.ptr_D)>(v0.d);
    args.epilogue.dD = v0.sd;
  } else {
    args.problem_shape = typename R::ProblemShape{in.groups, arr.problem, host_problems};
    args.mainloop.ptr_A = reinterpret_cast<decltype(args.mainloop.ptr_A)>(arr.a);
    args.mainloop.dA = arr.sa;
    args.mainloop.ptr_B = reinterpret_cast<decltype(args.mainloop.ptr_B)>(arr.b);
    args.mainloop.dB = arr.sb;
    args.mainloop.ptr_SFA = reinterpret_cast<decltype(args.mainloop.ptr_SFA)>(arr.sfa);
    args.mainloop.layout_SFA = arr.lsfa;
    args.mainloop.ptr_SFB = reinterpret_cast<decltype(args.mainloop.ptr_SFB)>(arr.sfb);
    args.mainloop.layout_SFB = arr.lsfb;
    args.epilogue.ptr_D = reinterpret_cast<decltype(args.epilogue.ptr_D)>(arr.d);
    args.epilogue.dD = arr.sd;
  }
  // D = alpha[group] * acc (no C): alpha per group through the L stride.
  auto& f = args.epilogue.thread;
  f.alpha = 0.0f;
  f.beta = 0.0f;
  f.alpha_ptr = arr.alpha;
  f.dAlpha = {cute::_0{}, cute::_0{}, 1};
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

inline std::string status_text(cutlass::Status s) { return cutlassGetStatusString(s); }

// ---- the host hooks (no GPU) ----

template <class R>
std::string can_implement_host(int n, int k, const int32_t* m_per_group, int groups, int max_n) {
  using T = ArgTypes<R>;
  std::vector<int32_t> offsets(size_t(groups) + 1, 0);
  std::vector<typename T::Shape> problems(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    const int32_t m = m_per_group[g];
    if (R::kSlabs && m > max_n) return "an expert's rows exceed the slab (max_n)";
    offsets[size_t(g) + 1] = offsets[size_t(g)] + m;
    problems[size_t(g)] = typename T::Shape(n, m, k);
  }
  BsGroupInput in;
  in.n = n;
  in.k = k;
  in.groups = groups;
  in.offsets = offsets.data();
  in.max_n = max_n;
  ArgArrays<R> none{};
  // Slabs: CUTLASS checks the whole [N, max_n, K, E] tensor (no host token counts: with them it
  // would take group 0's count for the maximum).
  const auto args = make_arguments<R>(in, none, problems.data(), nullptr, 1, 0);
  const cutlass::Status s = R::Gemm::can_implement(args);
  return s == cutlass::Status::kSuccess ? std::string() : status_text(s);
}

template <class R>
size_t cutlass_workspace_host(int groups, int sm_count, int max_n) {
  std::vector<int32_t> offsets(size_t(groups) + 1, 0);
  BsGroupInput in;
  in.n = R::kM;
  in.k = R::kK;
  in.groups = groups;
  in.offsets = offsets.data();
  in.max_n = max_n;
  ArgArrays<R> none{};
  return R::Gemm::get_workspace_size(make_arguments<R>(in, none, nullptr, nullptr, sm_count, 0));
}

template <class Stride>
void flatten_stride(const Stride& s, int64_t out[3]) {
  out[0] = int64_t(cute::get<0>(s));
  out[1] = int64_t(cute::get<1>(s));
  out[2] = int64_t(cute::get<2>(s));
}

template <class R>
BsGroupArgsHost describe_group_host(const BsGroupInput& in, int g, const int64_t* probes, int probes_n) {
  const GroupValues<R> v = group_values<R>(in, g);
  BsGroupArgsHost h;
  h.m = int(cute::get<0>(v.problem));
  h.n = int(cute::get<1>(v.problem));
  h.k = int(cute::get<2>(v.problem));
  h.a = v.a;
  h.b = v.b;
  h.sfa = v.sfa;
  h.sfb = v.sfb;
  h.d = v.d;
  flatten_stride(v.sa, h.stride_a);
  flatten_stride(v.sb, h.stride_b);
  flatten_stride(v.sd, h.stride_d);
  const int l = R::kSlabs ? g : 0;
  const int64_t a0 = R::kSlabs ? int64_t(v.lsfa(0, 0, l)) : 0, b0 = R::kSlabs ? int64_t(v.lsfb(0, 0, l)) : 0;
  for (int i = 0; i < probes_n; ++i) {
    const int row = int(probes[2 * i]), kk = int(probes[2 * i + 1]);
    h.sfa_at.push_back(int64_t(v.lsfa(row, kk, l)) - a0);
    h.sfb_at.push_back(int64_t(v.lsfb(row, kk, l)) - b0);
  }
  return h;
}

template <class R>
BsArgTypeSizes arg_type_sizes() {
  using T = ArgTypes<R>;
  return {int64_t(sizeof(typename T::Shape)),     int64_t(sizeof(typename T::StrideA)),
          int64_t(sizeof(typename T::StrideB)),   int64_t(sizeof(typename T::StrideD)),
          int64_t(sizeof(typename T::LayoutSFA)), int64_t(sizeof(typename T::LayoutSFB))};
}

// ---- the launch ----

template <class R>
std::string run_device(const BsLaunch& l) {
  if (l.in.groups <= 0) return {};
  const ArgArrays<R> arr = arg_arrays<R>(l.workspace, l.ws_layout);
  const int threads = 128, blocks = (l.in.groups + threads - 1) / threads;
  build_group_args_kernel<R><<<blocks, threads, 0, l.stream>>>(l.in, arr, l.w_global, l.act_global);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return std::string("argument builder launch: ") + cudaGetErrorString(e);
  typename R::Gemm gemm;
  const auto args = make_arguments<R>(l.in, arr, nullptr, nullptr, l.sm_count, l.device);
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) return "CUTLASS can_implement: " + status_text(s);
  s = gemm.initialize(args, static_cast<char*>(l.workspace) + l.ws_layout.cutlass, l.stream);
  if (s != cutlass::Status::kSuccess) return "CUTLASS initialize: " + status_text(s);
  s = gemm.run(l.stream);
  if (s != cutlass::Status::kSuccess) return "CUTLASS run: " + status_text(s);
  return {};
}

template <class R>
BsKernel make_kernel() {
  return BsKernel{facts_of<R>(), arg_type_sizes<R>(), &can_implement_host<R>, &cutlass_workspace_host<R>,
                  &describe_group_host<R>, &run_device<R>};
}

}  // namespace fp4moe::cuda::sm1xx
