// Shared by the GPU runner's tests (tests/backend/gpu_*_test.cpp): the tiny GLM-5 goldens'
// checkpoints (tests/model/golden) as BF16, NVIDIA's NVFP4 layout (routed experts only) and
// all-NVFP4 (`fp4moe quantize`, made once per process), small runner options, prompts,
// requests prefilled for decode steps, the bit-for-bit logits check.
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "backend/cuda/gpu_runner.hpp"
#include "model/model_test_util.hpp"
#include "model/sequence_forward.hpp"

namespace fp4moe::testing_gpu_runner {

namespace fs = std::filesystem;
using testing_model::golden_dir;

struct Case {
  std::string name, variant;  // golden folder; "bf16" | "nvfp4" | "nvfp4_all"
};

inline std::string model_dir(const Case& c) {
  if (c.variant == "bf16") return golden_dir(c.name) + "/model";
  static std::map<std::string, std::string> made;
  static testing_cli::TempDir tmp("gpu_runner_models");
  const std::string key = c.name + "_" + c.variant;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const fs::path out = tmp.path / key;
  const std::string extra = c.variant == "nvfp4" ? " --only '*.mlp.experts.*' --input-amax 8" : "";
  const auto r = testing_cli::run_binary(tmp.path, "quantize " + golden_dir(c.name) + "/model " + out.string() + extra);
  EXPECT_EQ(r.rc, 0) << r.err;
  return made[key] = out.string();
}

inline engine::gpu::RunnerOptions small_options() {
  engine::gpu::RunnerOptions o;
  o.max_tokens = 128;
  o.max_requests = 8;
  o.max_context = 256;
  o.page_size = 16;
  o.max_total_tokens = 4096;
  o.cuda_graph_max_bs = 8;
  o.quiet = true;
  o.poison = true;
  return o;
}

inline std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(2 + (i * 37 + seed * 101 + 7) % (vocab - 2)));
  return p;
}

// The runner over a FIXED token sequence (teacher forcing; the twin of
// testing_model::forward_sequence): one step over the first `prefill` tokens, then one step per
// token; every position's next-token logits, the prefill step's hidden states, every step's
// routing / top-k choices (StepChoices: eager steps).
struct GpuSequenceForward {
  std::vector<float> logits;  // [tokens, vocab]
  model::HiddenStates hidden;
  std::vector<engine::gpu::StepChoices> choices;  // one per step
};

inline GpuSequenceForward gpu_forward_sequence(engine::gpu::GpuRunner& gpu, const std::vector<int32_t>& tokens,
                                               int64_t prefill) {
  const int64_t T = int64_t(tokens.size()), page = gpu.page_size();
  const std::vector<int32_t> table = gpu.alloc_pages((T + page - 1) / page);
  const int32_t page_ptr[2] = {0, int32_t(table.size())};
  GpuSequenceForward r;
  std::vector<float> rows;
  auto run = [&](int64_t p0, int64_t n) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
    const int32_t qo[2] = {0, int32_t(n)}, len[1] = {int32_t(p0 + n)};
    engine::gpu::StepInput in;
    in.tokens = tokens.data() + p0;
    in.batch = {1, n, qo, pos.data(), len, page_ptr, table.data()};
    for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(int32_t(i));
    engine::gpu::StepOutput out;
    out.logits = &rows;
    out.hidden = p0 == 0 ? &r.hidden : nullptr;
    out.choices = &r.choices.emplace_back();
    gpu.step(in, out);
    r.logits.insert(r.logits.end(), rows.begin(), rows.end());
  };
  run(0, prefill);
  for (int64_t p = prefill; p < T; ++p) run(p, 1);
  gpu.release_pages(table);
  return r;
}

// Requests whose prompts (but their last token) are in the cache, ready for decode steps: the
// page table of each covers `room` positions past its last token (pages of gpu.page_size()).
struct Decoding {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> tok, pos, qo{0}, len, pp{0}, pi;
  KvBatchView batch() const {
    const int64_t B = int64_t(tok.size());
    return {B, B, qo.data(), pos.data(), len.data(), pp.data(), pi.data()};
  }
  // One decode step of every request, a logits row each, these sampling rows.
  engine::gpu::StepInput step(std::vector<engine::RowSampling> sampling) const {
    engine::gpu::StepInput in;
    in.tokens = tok.data();
    in.batch = batch();
    for (size_t r = 0; r < tok.size(); ++r) in.logits_rows.push_back(int32_t(r));
    in.sampling = std::move(sampling);
    return in;
  }
  void release(engine::gpu::GpuRunner& g) {
    for (const auto& t : tables) g.release_pages(t);
  }
};

inline Decoding prefill(engine::gpu::GpuRunner& gpu, const std::vector<int64_t>& lens, int64_t room) {
  Decoding d;
  const int64_t V = gpu.config().vocab, page = gpu.page_size();
  for (size_t r = 0; r < lens.size(); ++r) {
    const int64_t n = lens[r];
    d.tables.push_back(gpu.alloc_pages((n - 1 + room + page - 1) / page));
    const std::vector<int32_t> p = prompt_of(n, V, int(r) + 5);
    std::vector<int32_t> ps(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ps[size_t(i)] = int32_t(i);
    const int32_t q1[2] = {0, int32_t(n - 1)}, l1[1] = {int32_t(n - 1)}, ptr[2] = {0, int32_t(d.tables.back().size())};
    engine::gpu::StepInput pre;
    pre.tokens = p.data();
    pre.batch = {1, n - 1, q1, ps.data(), l1, ptr, d.tables.back().data()};
    if (n > 1) gpu.step(pre, {});
    d.tok.push_back(p.back());
    d.pos.push_back(int32_t(n - 1));
    d.len.push_back(int32_t(n));
    d.qo.push_back(int32_t(r + 1));
    d.pi.insert(d.pi.end(), d.tables.back().begin(), d.tables.back().end());
    d.pp.push_back(int32_t(d.pi.size()));
  }
  return d;
}

// Two runs' logits, bit for bit (graph replay vs eager), every value finite.
inline void expect_bitwise_equal(const std::vector<float>& eager, const std::vector<float>& graph, int64_t V,
                                 const std::string& what) {
  ASSERT_EQ(eager.size(), graph.size()) << what;
  for (size_t i = 0; i < eager.size(); ++i) {
    ASSERT_TRUE(std::isfinite(eager[i])) << what << " logit " << i;
    ASSERT_EQ(std::memcmp(&eager[i], &graph[i], 4), 0) << what << " row " << i / size_t(V) << " col " << i % size_t(V)
                                                       << ": " << eager[i] << " vs " << graph[i];
  }
}

// One step of one run, kept for the batch-vs-alone comparison: per layer the hidden state entering
// it ([rows, H]) and its discrete choices (routing, top-k positions), the logits row and token.
struct StepRecord {
  model::HiddenStates hidden;
  engine::gpu::StepChoices choices;
  std::vector<float> logits;  // [requests, V]
  std::vector<int32_t> greedy;
};

// Runs `in` eagerly with hidden states and choices (forces eager; writes the same KV again).
inline StepRecord record_step(engine::gpu::GpuRunner& gpu, const engine::gpu::StepInput& in) {
  StepRecord r;
  engine::gpu::StepOutput o;
  o.logits = &r.logits;
  o.greedy = &r.greedy;
  o.hidden = &r.hidden;
  o.choices = &r.choices;
  gpu.step(in, o);
  return r;
}

// Rows [a0, a0 + n) of run A's per-row vector `va` (row width w) equal rows [b0, b0 + n) of `vb`.
template <class T>
bool same_rows(const std::vector<T>& va, int64_t a0, const std::vector<T>& vb, int64_t b0, int64_t n, int64_t T_a,
               int64_t T_b) {
  if (va.empty() || vb.empty()) return va.empty() && vb.empty();
  const int64_t w = int64_t(va.size()) / T_a;
  if (int64_t(vb.size()) / T_b != w) return false;
  return std::equal(va.begin() + a0 * w, va.begin() + (a0 + n) * w, vb.begin() + b0 * w);
}

// Requests of the given lengths prefilled in ONE step (mixed), then `steps` decode steps together
// (graphs where the runner has them), against each request run alone (its own prefill and decode
// steps). Per request and step, layer by layer: while the discrete choices (MoE routing, DSA top-k)
// of the request's rows are the same as alone, its logits must match (rel L2 <= 1e-2) and so must
// its greedy token where the alone top-2 margin > 1e-2. A choice that differs is allowed only as a
// near tie: the hidden state entering that layer must still match (rel L2 <= 1e-2), i.e. rounding
// (a different kernel split for a different batch) tipped a tie; the request is then not compared
// further (its cache differs from there) and the case is printed. At least a third of the
// (request, step) pairs must be compared through the logits. Both runs follow the alone tokens.
// Prompts: prompt_of(len, vocab, seed + i). Returns how many of the batched steps replayed a graph.
inline int64_t expect_batch_equals_alone(engine::gpu::GpuRunner& gpu, const std::vector<int64_t>& lens, int64_t steps,
                                      int seed) {
  const int64_t V = gpu.config().vocab, page = gpu.page_size(), H = gpu.config().hidden;
  const int64_t R = int64_t(lens.size());
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < R; ++i) prompts.push_back(prompt_of(lens[size_t(i)], V, int(i) + seed));
  // The batched step's input for the sequences `seqs` at step s (s = 0: whole prompts).
  struct Built {
    std::vector<int32_t> tok, pos, qo{0}, len, pp{0}, pi, rows;
    engine::gpu::StepInput in;
  };
  auto build = [&](const std::vector<std::vector<int32_t>>& seqs, const std::vector<std::vector<int32_t>>& tables,
                   const std::vector<int64_t>& which, int64_t s, Built& b) {
    for (int64_t r : which) {
      const auto& q = seqs[size_t(r)];
      const int64_t n = int64_t(q.size()), from = s == 0 ? 0 : n - 1;
      for (int64_t p = from; p < n; ++p) b.tok.push_back(q[size_t(p)]), b.pos.push_back(int32_t(p));
      b.qo.push_back(int32_t(b.tok.size()));
      b.rows.push_back(int32_t(b.tok.size()) - 1);
      b.len.push_back(int32_t(n));
      b.pi.insert(b.pi.end(), tables[size_t(r)].begin(), tables[size_t(r)].end());
      b.pp.push_back(int32_t(b.pi.size()));
    }
    const int64_t n = int64_t(which.size());
    b.in.tokens = b.tok.data();
    b.in.batch = {n, int64_t(b.tok.size()), b.qo.data(), b.pos.data(), b.len.data(), b.pp.data(), b.pi.data()};
    b.in.logits_rows = b.rows;
  };
  // Alone: each request's own steps, eager, recorded; its greedy tokens are the sequence both follow.
  std::vector<std::vector<StepRecord>> alone(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> seqs = prompts;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<std::vector<int32_t>> t(static_cast<size_t>(R));
    t[size_t(r)] = gpu.alloc_pages((lens[size_t(r)] + steps + 1 + page - 1) / page);
    for (int64_t s = 0; s <= steps; ++s) {
      Built b;
      build(seqs, t, {r}, s, b);
      alone[size_t(r)].push_back(record_step(gpu, b.in));
      seqs[size_t(r)].push_back(alone[size_t(r)].back().greedy.at(0));
    }
    gpu.release_pages(t[size_t(r)]);
  }
  std::vector<std::vector<int32_t>> tables;
  for (int64_t r = 0; r < R; ++r) tables.push_back(gpu.alloc_pages((lens[size_t(r)] + steps + 1 + page - 1) / page));
  std::vector<int64_t> all;
  for (int64_t r = 0; r < R; ++r) all.push_back(r);
  seqs = prompts;
  std::vector<bool> diverged(static_cast<size_t>(R), false);
  int64_t compared = 0, graph_steps = 0;
  const int L = int(gpu.config().num_layers);
  for (int64_t s = 0; s <= steps; ++s) {
    Built b;
    build(seqs, tables, all, s, b);
    std::vector<float> logits;
    std::vector<int32_t> greedy;
    const int64_t g0 = gpu.stats().graph_steps;
    gpu.step(b.in, {&logits, &greedy, nullptr});  // the serving path (graphs for decode buckets)
    graph_steps += gpu.stats().graph_steps - g0;
    const StepRecord batched = record_step(gpu, b.in);
    const int64_t Tb = int64_t(b.tok.size());
    for (int64_t r = 0; r < R; ++r) {
      const StepRecord& a = alone[size_t(r)][size_t(s)];
      const int64_t b0 = b.qo[size_t(r)], n = b.qo[size_t(r + 1)] - b0;
      if (!diverged[size_t(r)]) {
        for (int l = 0; l < L && !diverged[size_t(r)]; ++l) {
          const auto& cb = batched.choices;
          const auto& ca = a.choices;
          if (same_rows(cb.expert_ids[size_t(l)], b0, ca.expert_ids[size_t(l)], 0, n, Tb, n) &&
              same_rows(cb.topk_positions[size_t(l)], b0, ca.topk_positions[size_t(l)], 0, n, Tb, n))
            continue;
          const double dh = testing_model::rel_l2(batched.hidden[size_t(l)].data() + b0 * H,
                                                  a.hidden[size_t(l)].data(), size_t(n * H));
          EXPECT_LE(dh, 1e-2) << "request " << r << " step " << s << ": layer " << l
                              << "'s choices differ and the hidden state entering it already differs";
          std::printf("[ info ] request %lld step %lld: layer %d's choices differ from alone (a near tie: the hidden "
                      "state entering it rel L2 %.2e); not compared further\n",
                      (long long)r, (long long)s, l, dh);
          diverged[size_t(r)] = true;
        }
      }
      if (diverged[size_t(r)]) continue;
      ++compared;
      const float* al = a.logits.data();
      EXPECT_LE(testing_model::rel_l2(logits.data() + r * V, al, size_t(V)), 1e-2) << "request " << r << " step " << s;
      if (testing_model::top2_margin(al, V) > 1e-2f) {
        EXPECT_EQ(greedy[size_t(r)], a.greedy.at(0)) << "request " << r << " step " << s;
      }
    }
    for (int64_t r = 0; r < R; ++r) seqs[size_t(r)].push_back(alone[size_t(r)][size_t(s)].greedy.at(0));
  }
  std::printf("[ info ] batch vs alone: %lld of %lld (request, step) pairs compared through the logits\n",
              (long long)compared, (long long)(R * (steps + 1)));
  EXPECT_GE(3 * compared, R * (steps + 1)) << "too few pairs compared: near ties everywhere?";
  for (const auto& t : tables) gpu.release_pages(t);
  return graph_steps;
}

}  // namespace fp4moe::testing_gpu_runner
