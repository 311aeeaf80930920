#include "tuner/profiler.hpp"

#include "core/error.hpp"

#ifndef FP4MOE_HAVE_CUDA

namespace fp4moe::tuner {
bool profiler_available() { return false; }
ProblemResult profile_problem(const std::string&, const GemmProblem&, const ArchInfo&, const ProfileOptions&) {
  FP4MOE_FAIL("this fp4moe was built without CUDA: the profiler is not available (use --dry-run)");
}
}  // namespace fp4moe::tuner

#else

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/bf16.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "cpu/grouped_gemm_ref.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/dequant_cublas.hpp"
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"
#include "tuner/plan_cache.hpp"

namespace fp4moe::tuner {
namespace {

// splitmix64: a small, fast, seedable generator (same numbers on every host).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
};

// Random FP4 experts: any byte is a valid pair of E2M1 codes; scales in [2^-2, 2^1] (E4M3
// exponent fields 5..8) or E8M0 124..128; globals ~ 1/64 so outputs stay O(1..100).
ExpertStack random_experts(const GemmProblem& p, uint64_t seed) {
  ExpertStack w;
  w.format = p.weight;
  w.num_experts = p.num_experts;
  w.n = p.n;
  w.k = p.k;
  const int64_t block = w.block();
  w.packed.resize(size_t(p.num_experts) * p.n * (p.k / 2));
  w.scales.resize(size_t(p.num_experts) * p.n * (p.k / block));
  w.global_scale.assign(size_t(p.num_experts), p.weight == WeightFormat::MXFP4 ? 1.0f : 1.0f / 64);
  const int64_t chunk = int64_t(1) << 22;
  const int64_t np = int64_t(w.packed.size()), ns = int64_t(w.scales.size());
  parallel_for((np + chunk - 1) / chunk, default_num_threads(), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Rng r{seed ^ uint64_t(c) * 0x2545f4914f6cdd1dull};
      const int64_t lo = c * chunk, hi = std::min(np, lo + chunk);
      for (int64_t i = lo; i < hi; i += 8) {
        const uint64_t v = r.next();
        for (int64_t j = 0; j < 8 && i + j < hi; ++j) w.packed[size_t(i + j)] = uint8_t(v >> (8 * j));
      }
    }
  });
  const bool mx = p.weight == WeightFormat::MXFP4;
  parallel_for((ns + chunk - 1) / chunk, default_num_threads(), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Rng r{~seed ^ uint64_t(c) * 0x9e3779b97f4a7c15ull};
      const int64_t lo = c * chunk, hi = std::min(ns, lo + chunk);
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t v = r.next();
        w.scales[size_t(i)] = mx ? uint8_t(124 + v % 5) : uint8_t(((5 + v % 4) << 3) | ((v >> 8) & 7));
      }
    }
  });
  return w;
}

using cuda::DeviceBuffer;

// One tokens bucket's inputs: routing, activations (rotated copies), outputs.
struct BucketInputs {
  int64_t tokens = 0, m_total = 0;
  int experts_hit = 0;
  std::vector<int32_t> offsets;            // [E+1] host
  std::vector<uint16_t> x;                 // [m_total, K] host (the reference reads it)
  std::vector<float> row_scale;            // [m_total] host
  DeviceBuffer d_offsets, d_x, d_y, d_row_scale, d_ws;
  int copies = 1;
  size_t x_bytes = 0, y_row_bytes = 0;
  const void* x_copy(int copy) const { return d_x.as<const uint8_t>() + size_t(copy) * x_bytes; }
};

BucketInputs make_inputs(const GemmProblem& p, int64_t tokens, int64_t l2_bytes, uint64_t seed) {
  BucketInputs in;
  in.tokens = tokens;
  in.m_total = tokens * p.top_k;
  Rng r{seed};
  std::vector<int32_t> counts(size_t(p.num_experts), 0);
  std::vector<int> pick;
  for (int64_t t = 0; t < tokens; ++t) {
    pick.clear();
    while (int(pick.size()) < std::min(p.top_k, p.num_experts)) {
      const int e = int(r.next() % uint64_t(p.num_experts));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    for (int e : pick) counts[size_t(e)]++;
  }
  in.offsets.assign(size_t(p.num_experts) + 1, 0);
  for (int e = 0; e < p.num_experts; ++e) {
    in.offsets[size_t(e) + 1] = in.offsets[size_t(e)] + counts[size_t(e)];
    in.experts_hit += counts[size_t(e)] > 0;
  }
  in.m_total = in.offsets.back();
  in.x_bytes = size_t(in.m_total) * size_t(p.k) * 2;
  // Enough copies that consecutive runs never find their activations in L2 (2x L2), <= 4 GiB.
  const size_t l2 = size_t(std::max<int64_t>(l2_bytes, 64 << 20));
  in.copies = int(std::clamp<size_t>((2 * l2 + in.x_bytes - 1) / in.x_bytes, 1, 64));
  while (in.copies > 1 && size_t(in.copies) * in.x_bytes > (size_t(4) << 30)) --in.copies;
  std::vector<uint16_t>& x = in.x;
  x.resize(size_t(in.m_total) * size_t(p.k));
  const int64_t nx = int64_t(x.size()), chunk = int64_t(1) << 20;
  parallel_for((nx + chunk - 1) / chunk, default_num_threads(), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Rng rc{seed * 31 + uint64_t(c) * 0x9e3779b97f4a7c15ull};
      for (int64_t i = c * chunk; i < std::min(nx, (c + 1) * chunk); ++i)
        x[size_t(i)] = float_to_bf16(float(rc.uniform() * 2 - 1));
    }
  });
  in.d_x = DeviceBuffer(std::max<size_t>(in.x_bytes * size_t(in.copies), 16));
  in.d_x.upload(x);
  for (int c = 1; c < in.copies; ++c)  // the copies differ only in address: that is what defeats L2
    FP4MOE_CUDA_CHECK(cudaMemcpy(in.d_x.as<uint8_t>() + size_t(c) * in.x_bytes, in.d_x.ptr(), in.x_bytes,
                                 cudaMemcpyDeviceToDevice));
  in.d_offsets = DeviceBuffer::from(in.offsets);
  in.row_scale.resize(size_t(std::max<int64_t>(in.m_total, 1)));
  for (auto& v : in.row_scale) v = float(0.25 + 0.75 * r.uniform());
  in.d_row_scale = DeviceBuffer::from(in.row_scale);
  const int n_out = p.epilogue == Epilogue::SiluMul ? p.n / 2 : p.n;
  in.y_row_bytes = size_t(n_out) * 2;
  in.d_y = DeviceBuffer(std::max<size_t>(size_t(in.m_total) * in.y_row_bytes, 16));
  return in;
}

// Output rows `rows` of y (bf16) as floats.
std::vector<float> download_rows(const BucketInputs& in, const std::vector<int64_t>& rows) {
  const size_t cols = in.y_row_bytes / 2;
  std::vector<uint16_t> h(rows.size() * cols);
  for (size_t i = 0; i < rows.size(); ++i)
    FP4MOE_CUDA_CHECK(cudaMemcpy(h.data() + i * cols, in.d_y.as<uint8_t>() + size_t(rows[i]) * in.y_row_bytes,
                                 in.y_row_bytes, cudaMemcpyDeviceToHost));
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_float(h[i]);
  return f;
}

// A CUDA error that poisons the context: nothing after it can be trusted.
bool context_broken() {
  const cudaError_t e = cudaDeviceSynchronize();
  cudaGetLastError();
  return e != cudaSuccess;
}

}  // namespace

bool profiler_available() { return have_device(); }

ProblemResult profile_problem(const std::string& op, const GemmProblem& p, const ArchInfo& arch,
                              const ProfileOptions& opt) {
  FP4MOE_CHECK(op == "moe-gemm", "profiler: unknown op '{}'", op);
  FP4MOE_CHECK(have_device(), "profiler: no CUDA device");
  ProblemResult result;
  result.problem = p;
  // The tactics that can run here and are implemented.
  std::vector<Tactic> runnable;
  std::map<GemmKernel, std::string> setup_error;  // an implementation whose weights / handles could not be set up
  for (const TacticDef& d : tactics_for(op, p)) {
    const Feasibility f = d.valid(p, arch);
    if (f.ok && !impl_is_listed_only(d.tactic.kernel)) runnable.push_back(d.tactic);
  }
  const auto t0 = std::chrono::steady_clock::now();
  log_info("tune: {}: generating and uploading random FP4 experts ({:.1f} GB)", to_string(p),
           double(p.num_experts) * p.n * (p.k / 2 + p.k / 16) * 1e-9);
  int64_t max_rows = 0;
  for (int64_t t : opt.tokens) max_rows = std::max(max_rows, t * p.top_k);
  const cuda::MoeGemmDesc desc = desc_of(p, int(max_rows));
  std::optional<cuda::DeviceExpertWeights> w_sm90;
  std::unique_ptr<cuda::DeviceLinearFp4Weights> w_linear;
  const ExpertStack host = random_experts(p, opt.seed);  // kept: the CPU reference reads it
  {
    const bool any_sm90 = std::any_of(runnable.begin(), runnable.end(), [](const Tactic& t) {
      return t.kernel == GemmKernel::Sm90Wgmma || t.kernel == GemmKernel::Sm90Decode;
    });
    if (any_sm90) {
      try {
        w_sm90 = cuda::upload_weights(host, desc.epilogue);
      } catch (const Error& e) {
        setup_error[GemmKernel::Sm90Wgmma] = setup_error[GemmKernel::Sm90Decode] = fmt::format("weight upload failed: {}", e.what());
      }
    }
    w_linear = std::make_unique<cuda::DeviceLinearFp4Weights>(host);
  }
  std::unique_ptr<cuda::DequantCublasGemm> cublas;
  if (std::any_of(runnable.begin(), runnable.end(), [](const Tactic& t) { return t.kernel == GemmKernel::DequantCublas; })) {
    try {
      cublas = std::make_unique<cuda::DequantCublasGemm>(desc);
    } catch (const Error& e) {
      setup_error[GemmKernel::DequantCublas] = fmt::format("set-up failed: {}", e.what());
    }
  }
  log_info("tune: weights ready in {:.1f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  cudaStream_t stream;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev_begin, ev_end;
  FP4MOE_CUDA_CHECK(cudaEventCreate(&ev_begin));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&ev_end));
  // Weights are not rotated (they are GBs), so a small problem's hit experts could stay in L2
  // between runs: every timed run starts after a write of 2x L2 (outside the timed events).
  const size_t flush_bytes = size_t(std::max<int64_t>(2 * arch.l2_bytes, int64_t(128) << 20));
  DeviceBuffer flush(flush_bytes);
  bool broken = false;
  const double weight_bytes_per_expert = double(p.n) * p.k / 2 + double(p.n) * p.k / (p.weight == WeightFormat::MXFP4 ? 32 : 16) + 4;

  for (size_t bi = 0; bi < opt.tokens.size(); ++bi) {
    const int64_t tokens = opt.tokens[bi];
    BucketInputs in = make_inputs(p, tokens, arch.l2_bytes, opt.seed + 7919 * uint64_t(tokens));
    BucketResult br;
    br.tokens = tokens;
    br.bucket = tokens_bucket(tokens);
    br.m_total = in.m_total;
    br.experts_hit = in.experts_hit;
    br.flops = 2.0 * double(in.m_total) * p.n * p.k;
    br.bytes = in.experts_hit * weight_bytes_per_expert + double(in.x_bytes) + double(in.m_total) * in.y_row_bytes;

    auto run_once = [&](const Tactic& t, int copy) {
      cuda::MoeGemmArgs a;
      a.x = in.x_copy(copy);
      a.expert_offsets = in.d_offsets.as<const int32_t>();
      a.row_scale = in.d_row_scale.as<const float>();
      a.y = in.d_y.ptr();
      a.m_total = int(in.m_total);
      a.stream = stream;
      switch (t.kernel) {
        case GemmKernel::Sm90Wgmma:
        case GemmKernel::Sm90Decode: {
          const cuda::TileConfig& c = t;
          const size_t ws = cuda::workspace_bytes(desc, c);
          if (ws > in.d_ws.bytes()) in.d_ws = DeviceBuffer(ws);
          a.workspace = ws ? in.d_ws.ptr() : nullptr;
          cuda::run_moe_gemm(desc, c, *w_sm90, a);
          break;
        }
        case GemmKernel::Generic: cuda::run_generic_grouped_gemm(desc, w_linear->view(), a); break;
        case GemmKernel::DequantCublas:
          FP4MOE_CHECK(cublas != nullptr, "dequant-cublas could not be set up");
          cublas->run(w_linear->view(), a, in.offsets);
          break;
        default: FP4MOE_FAIL("{} is listed only: it cannot run here", tactic_name(t));
      }
      FP4MOE_CUDA_CHECK(cudaGetLastError());
    };
    auto poison = [&] { FP4MOE_CUDA_CHECK(cudaMemsetAsync(in.d_y.ptr(), 0xff, size_t(in.m_total) * in.y_row_bytes, stream)); };

    // The reference: the CPU's, on sampled rows (no tactic under test is its own judge).
    const std::vector<int64_t> rows = sample_rows(in.offsets.data(), p.num_experts, opt.check_rows);
    const GroupedGemmRef gr{&host, in.x.data(), in.m_total, in.offsets.data(), in.row_scale.data(),
                            p.epilogue, p.act == ActFormat::NVFP4_EMULATED};
    const std::vector<double> ref = grouped_gemm_reference(gr, rows);

    for (const Tactic& t : runnable) {
      Measurement m;
      m.tactic = t;
      if (broken) {
        m.status = Measurement::Status::Skipped;
        m.error = "skipped: an earlier CUDA error left the context unusable";
        br.dropped.push_back(m);
        continue;
      }
      if (auto it = setup_error.find(t.kernel); it != setup_error.end()) {
        m.status = Measurement::Status::LaunchFailed;
        m.error = it->second;
        br.dropped.push_back(m);
        continue;
      }
      try {
        // Correctness first, on poisoned output.
        poison();
        run_once(t, 0);
        FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (!rows.empty()) {
          const RowErrors re = compare_rows(download_rows(in, rows), ref, reference_cols(gr), opt.tolerance);
          m.rel_err = re.worst;
          if (re.bad_rows > 0) {
            m.status = Measurement::Status::Disqualified;
            m.error = fmt::format("output differs from the CPU reference: {} of {} checked rows above {:.0e} (worst: row "
                                  "{}, rel err {:.3g})",
                                  re.bad_rows, rows.size(), opt.tolerance, rows[size_t(re.worst_row)], re.worst);
          }
        }
        if (m.status == Measurement::Status::Ok) {
          for (int i = 0; i < opt.warmup; ++i) run_once(t, (i + 1) % in.copies);
          FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
          std::vector<float> ms;
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < 400; ++i) {
            FP4MOE_CUDA_CHECK(cudaMemsetAsync(flush.ptr(), i & 0xff, flush_bytes, stream));
            FP4MOE_CUDA_CHECK(cudaEventRecord(ev_begin, stream));
            run_once(t, i % in.copies);
            FP4MOE_CUDA_CHECK(cudaEventRecord(ev_end, stream));
            FP4MOE_CUDA_CHECK(cudaEventSynchronize(ev_end));
            float v = 0;
            FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&v, ev_begin, ev_end));
            ms.push_back(v);
            const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (int(ms.size()) >= opt.min_runs && (spent > opt.max_seconds_per_tactic || int(ms.size()) >= 100)) break;
          }
          std::sort(ms.begin(), ms.end());
          m.runs = int(ms.size());
          m.median_us = 1e3 * (ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]));
          m.min_us = 1e3 * ms.front();
          m.tflops = br.flops / (m.median_us * 1e-6) * 1e-12;
          m.gbps = br.bytes / (m.median_us * 1e-6) * 1e-9;
        }
      } catch (const Error& e) {
        m.status = Measurement::Status::LaunchFailed;
        m.error = e.what();
        broken = context_broken();
        if (broken) m.error += " (the CUDA context is unusable after this error)";
      }
      (m.status == Measurement::Status::Ok ? br.ranked : br.dropped).push_back(std::move(m));
    }
    std::sort(br.ranked.begin(), br.ranked.end(),
              [](const Measurement& a, const Measurement& b) { return a.median_us < b.median_us; });
    if (const Measurement* b = br.best())
      log_info("tune: {} tokens {}: best {} {:.1f} us", p.label, tokens, tactic_name(b->tactic), b->median_us);
    result.buckets.push_back(std::move(br));
  }
  cudaEventDestroy(ev_begin);
  cudaEventDestroy(ev_end);
  cudaStreamDestroy(stream);
  return result;
}

}  // namespace fp4moe::tuner

#endif
