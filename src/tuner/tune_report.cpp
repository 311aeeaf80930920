#include "tuner/tune_report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "format/checkpoint.hpp"

namespace fp4moe::tuner {
using nlohmann::json;

std::vector<GemmProblem> preset_problems(const std::string& preset, ActFormat act) {
  auto two = [act](int e, int top_k, int hidden, int inter) {
    GemmProblem gate_up{e, 2 * inter, hidden, top_k, WeightFormat::NVFP4, act, Epilogue::SiluMul, "gate_up"};
    GemmProblem down{e, hidden, inter, top_k, WeightFormat::NVFP4, act, Epilogue::RowScale, "down"};
    return std::vector<GemmProblem>{gate_up, down};
  };
  if (preset == "glm5") return two(256, 8, 6144, 2048);
  if (preset == "tiny") return two(8, 2, 512, 128);
  FP4MOE_FAIL("unknown preset '{}' (known: glm5, tiny)", preset);
}

std::vector<GemmProblem> model_problems(const std::string& dir, ActFormat act) {
  const auto ckpt = Checkpoint::open(dir);
  const ModelConfig& c = ckpt->config();
  FP4MOE_CHECK(c.moe.num_experts > 0 && c.moe.inter > 0 && c.moe.hidden > 0,
               "{}: config.json describes no MoE layer (experts {}, moe intermediate {}, hidden {})", dir,
               c.moe.num_experts, c.moe.inter, c.moe.hidden);
  const std::string algo = ckpt->quant().quant_algo, method = ckpt->quant().quant_method;
  WeightFormat w;
  if (algo.find("MXFP4") != std::string::npos || method == "mxfp4")
    w = WeightFormat::MXFP4;
  else if (algo.find("NVFP4") != std::string::npos || algo.find("nvfp4") != std::string::npos ||
           method == "compressed-tensors")
    w = WeightFormat::NVFP4;
  else
    FP4MOE_FAIL("{}: the experts are not FP4 (quant_method '{}', quant_algo '{}')", dir, method, algo);
  GemmProblem gate_up{int(c.moe.num_experts), int(2 * c.moe.inter), int(c.moe.hidden), int(c.moe.top_k), w, act,
                      Epilogue::SiluMul, "gate_up"};
  GemmProblem down{int(c.moe.num_experts), int(c.moe.hidden), int(c.moe.inter), int(c.moe.top_k), w, act,
                   Epilogue::RowScale, "down"};
  return {gate_up, down};
}

ProblemFeasibility check_feasibility(const std::string& op, const GemmProblem& p, const ArchInfo& arch) {
  ProblemFeasibility r;
  r.problem = p;
  for (const TacticDef& d : tactics_for(op, p)) {
    TacticVerdict v{d.tactic, d.valid(p, arch)};
    (v.feasibility.ok ? r.feasible : r.rejected).push_back(std::move(v));
  }
  return r;
}

std::string describe_arch(const ArchInfo& a) {
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  std::string s = fmt::format("{} ({}{}; from the {}): shared memory {} B per block (opt-in), {} B per SM, "
                              "{} B reserved per block; swizzled stages aligned to {} B\n",
                              a.name, a.gpu_name.empty() ? a.parts : a.gpu_name,
                              a.sm_count ? fmt::format(", {} SMs", a.sm_count) : "", a.source,
                              with_commas(a.smem_per_block_optin), with_commas(a.smem_per_sm),
                              with_commas(a.smem_reserved_per_block), a.swizzle_align);
  s += fmt::format("  registers {} per SM, {} per thread; threads {} per block, {} per SM; {} blocks per SM\n",
                   with_commas(a.regs_per_sm), a.regs_per_thread_max, a.max_threads_per_block, a.max_threads_per_sm,
                   a.max_blocks_per_sm);
  s += fmt::format("  cp.async {}, TMA {}, clusters {}, wgmma {}, tcgen05 {}, block-scaled FP4 MMA {}, FP8 MMA {}\n",
                   yn(a.cp_async), yn(a.tma), yn(a.clusters), yn(a.wgmma), yn(a.tcgen05), yn(a.block_scaled_mma),
                   yn(a.fp8_mma));
  return s;
}

namespace {

// Implementations in report order.
std::vector<GemmKernel> impls_in(const ProblemFeasibility& pf) {
  std::vector<GemmKernel> out;
  auto add = [&](GemmKernel i) {
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  };
  for (const auto& v : pf.feasible) add(v.tactic.kernel);
  for (const auto& v : pf.rejected) add(v.tactic.kernel);
  std::sort(out.begin(), out.end());
  return out;
}

std::string tile_of(const Tactic& t) {
  return fmt::format("{}x{}x{}", t.block_m, t.block_n, t.block_k);
}

}  // namespace

std::string format_feasibility(const std::string& op, const std::vector<ProblemFeasibility>& all,
                               const ArchInfo& arch, bool explain) {
  std::string s;
  for (const ProblemFeasibility& pf : all) {
    s += fmt::format("\n== {} {}: feasibility on {} (the same for every tokens bucket)\n", op,
                     to_string(pf.problem), arch.name);
    s += fmt::format("  can run ({}):\n", pf.feasible.size());
    for (const TacticVerdict& v : pf.feasible) {
      std::string extra;
      if (v.feasibility.smem) extra = fmt::format("{} B shared memory", with_commas(v.feasibility.smem->total()));
      if (impl_is_listed_only(v.tactic.kernel)) extra += extra.empty() ? "listed only" : "; listed only (not implemented)";
      s += fmt::format("    {:<34} {}\n", tactic_name(v.tactic), extra);
    }
    s += fmt::format("  rejected ({}):\n", pf.rejected.size());
    // Tactics whose instructions do not exist here: one line per implementation.
    std::map<GemmKernel, std::pair<int, std::string>> no_arch;
    for (const TacticVerdict& v : pf.rejected)
      if (v.feasibility.rejected_for(RejectKind::Arch))
        for (const Reason& r : v.feasibility.reasons)
          if (r.kind == RejectKind::Arch) {
            no_arch[v.tactic.kernel].first++;
            no_arch[v.tactic.kernel].second = r.text;
          }
    for (const auto& [impl, nr] : no_arch)
      s += fmt::format("    {:<34} {}\n", fmt::format("{} ({} configs)", impl_name(impl), nr.first), nr.second);
    for (const TacticVerdict& v : pf.rejected)
      if (!v.feasibility.rejected_for(RejectKind::Arch))
        s += fmt::format("    {:<34} {}\n", tactic_name(v.tactic), v.feasibility.reason());
    // Term-by-term shared memory: all (explain), else per implementation that exists on this
    // arch: the largest feasible config and the smallest one rejected for shared memory.
    std::vector<const TacticVerdict*> show;
    for (GemmKernel i : impls_in(pf)) {
      const TacticVerdict* big_ok = nullptr;
      const TacticVerdict* small_no = nullptr;
      for (const auto& v : pf.feasible)
        if (v.tactic.kernel == i && v.feasibility.smem && (explain || !big_ok || v.feasibility.smem->total() > big_ok->feasibility.smem->total())) {
          if (explain) show.push_back(&v);
          big_ok = &v;
        }
      for (const auto& v : pf.rejected)
        if (v.tactic.kernel == i && v.feasibility.smem && !v.feasibility.rejected_for(RejectKind::Arch) &&
            (explain || (v.feasibility.rejected_for(RejectKind::SharedMemory) &&
                         (!small_no || v.feasibility.smem->total() < small_no->feasibility.smem->total())))) {
          if (explain) show.push_back(&v);
          small_no = &v;
        }
      if (!explain) {
        if (big_ok) show.push_back(big_ok);
        if (small_no) show.push_back(small_no);
      }
    }
    if (!show.empty()) s += "  shared memory, term by term:\n";
    for (const TacticVerdict* v : show) {
      s += fmt::format("    {} ({} on {}: {} of {} B)\n", tactic_name(v->tactic),
                       v->feasibility.ok ? "fits" : "does not fit", arch.name, with_commas(v->feasibility.smem->total()),
                       with_commas(arch.smem_per_block_optin));
      s += v->feasibility.smem->explain("      ");
    }
  }
  s += "\nverdict: " + feasibility_verdict(op, all, arch) + "\n";
  return s;
}

std::string feasibility_verdict(const std::string& op, const std::vector<ProblemFeasibility>& all,
                                const ArchInfo& arch) {
  // Per implementation, over all problems: every tactic rejected for the arch? which tiles
  // are rejected for shared memory? how many configs can run (or would, but for numerics)?
  std::map<GemmKernel, int> total, runnable, numerics_only;
  std::map<GemmKernel, std::set<std::string>> smem_tiles;
  std::map<GemmKernel, int> arch_rejected;
  int64_t smem_example_need = 0;
  for (const ProblemFeasibility& pf : all) {
    for (const auto& v : pf.feasible) {
      total[v.tactic.kernel]++;
      runnable[v.tactic.kernel]++;
    }
    for (const auto& v : pf.rejected) {
      const Feasibility& f = v.feasibility;
      total[v.tactic.kernel]++;
      if (f.rejected_for(RejectKind::Arch)) arch_rejected[v.tactic.kernel]++;
      if (f.only_rejected_for(RejectKind::Numerics)) numerics_only[v.tactic.kernel]++;
      if (!f.rejected_for(RejectKind::Arch) && f.rejected_for(RejectKind::SharedMemory) && v.tactic.stages == 2) {
        smem_tiles[v.tactic.kernel].insert(tile_of(v.tactic));
        if (f.smem) smem_example_need = std::max(smem_example_need, f.smem->total());
      }
    }
  }
  std::vector<std::string> can, cannot;
  for (auto& [impl, n] : total) {
    const std::string name(impl_name(impl));
    if (arch_rejected[impl] == n) {
      cannot.push_back(fmt::format("{} (no such instructions on {})", name, arch.name));
      continue;
    }
    if (runnable[impl] > 0) {
      // Counts are over all problems; per problem when every problem agrees.
      const int np = int(all.size());
      const bool even = np > 0 && runnable[impl] % np == 0 && n % np == 0;
      const int r = even ? runnable[impl] / np : runnable[impl], t = even ? n / np : n;
      can.push_back(r == t || t <= 1 ? name
                                     : fmt::format("{} ({} of {} configs{})", name, r, t, even ? "" : " over all problems"));
    }
    if (numerics_only[impl] > 0) {
      if (!all.empty() && all[0].problem.act == ActFormat::BF16)
        can.push_back(fmt::format("{} ({} configs fit but compute W4A4: tune with --act w4a4)", name, numerics_only[impl]));
      else
        cannot.push_back(fmt::format("{} (computes W4A16 only)", name));
    }
    if (!smem_tiles[impl].empty()) {
      std::string tiles;
      for (const std::string& t : smem_tiles[impl]) tiles += (tiles.empty() ? "" : ", ") + t;
      cannot.push_back(fmt::format("{} {} (do not fit {} B of shared memory even at 2 stages)", name, tiles,
                                   with_commas(arch.smem_per_block_optin)));
    }
    if (runnable[impl] == 0 && numerics_only[impl] == 0 && smem_tiles[impl].empty())
      cannot.push_back(fmt::format("{} (see the reasons above)", name));
  }
  std::string s = fmt::format("{} on {}: ", op, arch.name);
  if (can.empty())
    s += "nothing can run";
  else {
    s += "can run ";
    for (size_t i = 0; i < can.size(); ++i) s += (i ? ", " : "") + can[i];
  }
  if (!cannot.empty()) {
    s += "; rejected: ";
    for (size_t i = 0; i < cannot.size(); ++i) s += (i ? "; " : "") + cannot[i];
  }
  s += ". Nothing was measured (dry run).";
  (void)smem_example_need;
  return s;
}

json feasibility_json(const std::vector<ProblemFeasibility>& all) {
  json out = json::array();
  for (const ProblemFeasibility& pf : all) {
    json tactics = json::array();
    auto one = [&](const TacticVerdict& v) {
      json t = {{"tactic", tactic_name(v.tactic)}, {"impl", std::string(impl_name(v.tactic.kernel))}, {"ok", v.feasibility.ok}};
      json reasons = json::array();
      for (const Reason& r : v.feasibility.reasons)
        reasons.push_back({{"kind", std::string(reject_kind_name(r.kind))}, {"text", r.text}});
      t["reasons"] = reasons;
      t["notes"] = v.feasibility.notes;
      if (v.feasibility.smem) {
        json terms = json::array();
        for (const SmemTerm& term : v.feasibility.smem->terms())
          terms.push_back({{"name", term.name}, {"bytes", term.bytes}, {"pad_before", term.pad}, {"offset", term.offset},
                           {"detail", term.detail}});
        t["smem"] = {{"total", v.feasibility.smem->total()}, {"padding", v.feasibility.smem->padding()}, {"terms", terms}};
      }
      tactics.push_back(t);
    };
    for (const auto& v : pf.feasible) one(v);
    for (const auto& v : pf.rejected) one(v);
    out.push_back({{"problem", to_string(pf.problem)}, {"label", pf.problem.label}, {"n", pf.problem.n},
                   {"k", pf.problem.k}, {"experts", pf.problem.num_experts}, {"tactics", tactics}});
  }
  return out;
}

// ---- measured ----

const Measurement* BucketResult::of(GemmKernel i) const {
  for (const Measurement& m : ranked)
    if (m.tactic.kernel == i) return &m;
  return nullptr;
}

std::string format_measured(const std::vector<ProblemResult>& results) {
  std::string s;
  for (const ProblemResult& pr : results) {
    s += fmt::format("\n== {}\n", to_string(pr.problem));
    for (const BucketResult& b : pr.buckets) {
      s += fmt::format("\n tokens {} (bucket {}): {} experts hit, {} rows; {:.3f} GFLOP, {:.1f} MB needed\n", b.tokens,
                       b.bucket, b.experts_hit, b.m_total, b.flops * 1e-9, b.bytes * 1e-6);
      const Measurement* base = b.of(GemmKernel::DequantCublas);
      const Measurement* best = b.best();
      s += fmt::format("  {:>4}  {:<34} {:>10} {:>9} {:>8} {:>8} {:>9} {:>8}\n", "rank", "tactic", "time us",
                       "TFLOP/s", "GB/s", "vs best", "vs cuBLAS", "rel err");
      int rank = 0;
      for (const Measurement& m : b.ranked) {
        s += fmt::format("| {:>4} | {:<34} | {:>10.1f} | {:>9.1f} | {:>8.0f} | {:>7.2f}x | {:>8} | {:>8} |\n", ++rank,
                         tactic_name(m.tactic), m.median_us, m.tflops, m.gbps, m.median_us / best->median_us,
                         base ? fmt::format("{:.2f}x", m.median_us / base->median_us) : "-",
                         m.rel_err >= 0 ? fmt::format("{:.1e}", m.rel_err) : "-");
      }
      for (const Measurement& m : b.dropped) {
        const char* what = m.status == Measurement::Status::LaunchFailed   ? "failed"
                           : m.status == Measurement::Status::Disqualified ? "disqualified"
                                                                           : "skipped";
        s += fmt::format("  {:<12} {:<34} {}\n", what, tactic_name(m.tactic), m.error);
      }
    }
  }
  return s;
}

std::string measured_verdict(const std::string& op, const std::vector<ProblemResult>& results) {
  // Which implementation is fastest where; how the baseline compares.
  std::map<GemmKernel, std::vector<std::string>> wins;  // impl -> "label@tokens"
  std::map<std::string, int> tactic_wins;
  int buckets = 0;
  double base_lo = 1e30, base_hi = 0;
  int base_buckets = 0;
  for (const ProblemResult& pr : results)
    for (const BucketResult& b : pr.buckets) {
      const Measurement* best = b.best();
      if (!best) continue;
      ++buckets;
      wins[best->tactic.kernel].push_back(fmt::format("{} {}", pr.problem.label, b.tokens));
      tactic_wins[tactic_name(best->tactic)]++;
      if (const Measurement* base = b.of(GemmKernel::DequantCublas); base && best->tactic.kernel != GemmKernel::DequantCublas) {
        base_lo = std::min(base_lo, base->median_us / best->median_us);
        base_hi = std::max(base_hi, base->median_us / best->median_us);
        ++base_buckets;
      }
    }
  if (buckets == 0) return fmt::format("{}: nothing could be measured", op);
  std::string s;
  if (wins.size() == 1) {
    const GemmKernel w = wins.begin()->first;
    std::string which(impl_name(w));
    if (tactic_wins.size() == 1) which = tactic_wins.begin()->first;
    s = fmt::format("{} is fastest at every bucket", which);
    if (tactic_wins.size() > 1) s += fmt::format(" ({} configs share the wins)", tactic_wins.size());
  } else {
    std::vector<std::string> parts;
    for (auto& [impl, where] : wins) {
      std::string list;
      for (size_t i = 0; i < where.size(); ++i) list += (i ? ", " : "") + where[i];
      parts.push_back(fmt::format("{} wins {} of {} ({})", impl_name(impl), where.size(), buckets, list));
    }
    for (size_t i = 0; i < parts.size(); ++i) s += (i ? "; " : "") + parts[i];
  }
  if (base_buckets > 0)
    s += fmt::format("; dequant-cublas (a dequantize pass, then one cuBLASLt GEMM per hit expert: no grouped "
                     "path) is {:.2f}-{:.2f}x slower",
                     base_lo, base_hi);
  // Our kernels (the wgmma kernel, the decode kernel, or both at different buckets) win
  // every bucket: the path is the best one measured.
  bool ours_everywhere = true;
  for (const auto& [impl, where] : wins) ours_everywhere &= impl == GemmKernel::Sm90Wgmma || impl == GemmKernel::Sm90Decode;
  if (ours_everywhere)
    s += wins.size() == 1 ? ": the current path is the best one."
                          : ": our two kernels split the buckets; the plan picks the faster per bucket: the current "
                            "path is the best one.";
  else if (wins.count(GemmKernel::DequantCublas))
    s += ": the cuBLAS baseline beats our kernels at some buckets; the plan uses it there.";
  else
    s += ": the plan picks the winner per bucket.";
  return fmt::format("{}: {}", op, s);
}

json measured_json(const std::vector<ProblemResult>& results) {
  json out = json::array();
  for (const ProblemResult& pr : results) {
    json buckets = json::array();
    for (const BucketResult& b : pr.buckets) {
      auto m_json = [](const Measurement& m) {
        return json{{"tactic", tactic_name(m.tactic)},
                    {"impl", std::string(impl_name(m.tactic.kernel))},
                    {"status", m.status == Measurement::Status::Ok             ? "ok"
                               : m.status == Measurement::Status::LaunchFailed ? "launch_failed"
                               : m.status == Measurement::Status::Disqualified ? "disqualified"
                                                                               : "skipped"},
                    {"median_us", m.median_us},
                    {"min_us", m.min_us},
                    {"runs", m.runs},
                    {"tflops", m.tflops},
                    {"gbps", m.gbps},
                    {"rel_err", m.rel_err},
                    {"error", m.error}};
      };
      json ranked = json::array(), dropped = json::array();
      for (const Measurement& m : b.ranked) ranked.push_back(m_json(m));
      for (const Measurement& m : b.dropped) dropped.push_back(m_json(m));
      buckets.push_back({{"tokens", b.tokens}, {"bucket", b.bucket}, {"m_total", b.m_total},
                         {"experts_hit", b.experts_hit}, {"flops", b.flops}, {"bytes", b.bytes},
                         {"ranked", ranked}, {"dropped", dropped}});
    }
    out.push_back({{"problem", to_string(pr.problem)}, {"label", pr.problem.label}, {"buckets", buckets}});
  }
  return out;
}

}  // namespace fp4moe::tuner
