// Test helpers over the CPU model:
// - forward_sequence: the model over a FIXED token sequence (teacher forcing; no sampling): one
//   step over the first `prefill` tokens (or one token per step), then one step per token, in a
//   fresh host KV cache whose page table is 0, 1, 2, ... — every position's next-token logits,
//   the prefill step's hidden states, and the cache afterwards. The reference the tests compare
//   paths against (prefill vs decode, imposed routing, GPU vs CPU).
// - generate_on_engine: `fp4moe generate`'s own path in-process — a CpuModelBackend over a model
//   folder and an engine::Engine running one request (engine/one_request.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"
#include "core/tensor.hpp"
#include "backend/cpu/cpu_model_backend.hpp"
#include "engine/engine.hpp"
#include "engine/one_request.hpp"
#include "model/kv_pool.hpp"
#include "model/model.hpp"

namespace fp4moe::testing_model {

struct ForwardOptions {
  int64_t page_size = 16;
  KvElem kv_elem = KvElem::F32;
  bool token_by_token = false;  // the prefill too, one token per step
  bool hidden = false;          // keep the prefill step's hidden states
};

struct SequenceForward {
  std::vector<float> logits;      // [tokens, vocab]: row i = the next-token logits after tokens[0 .. i]
  model::HiddenStates hidden;     // the prefill step's (ForwardOptions::hidden)
  std::shared_ptr<model::HostKvPool> kv;  // the cache afterwards; the sequence's page table is 0, 1, 2, ...
};

inline SequenceForward forward_sequence(model::Model& m, const std::vector<int32_t>& tokens, int64_t prefill,
                                        const ForwardOptions& o = {}) {
  const int64_t T = int64_t(tokens.size()), V = m.config().vocab;
  const int64_t pages = (T + o.page_size - 1) / o.page_size;
  SequenceForward r;
  r.kv = std::make_shared<model::HostKvPool>(m.kv_geometry(o.page_size, pages, o.kv_elem), m.kv_index_layers());
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int64_t p = 0; p < pages; ++p) table[size_t(p)] = int32_t(p);
  const int32_t page_ptr[2] = {0, int32_t(pages)};
  std::vector<int32_t> toks(tokens);
  auto run = [&](int64_t p0, int64_t n, model::HiddenStates* hidden) {
    std::vector<int32_t> pos(static_cast<size_t>(n)), rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i), rows[size_t(i)] = int32_t(i);
    const int32_t qo[2] = {0, int32_t(n)}, len[1] = {int32_t(p0 + n)};
    const KvBatchView b{1, n, qo, pos.data(), len, page_ptr, table.data()};
    std::vector<float> out(static_cast<size_t>(n * V));
    m.step(TensorView::of(toks.data() + p0, {n}), b, *r.kv, rows, TensorView::of(out.data(), {n, V}), hidden);
    r.logits.insert(r.logits.end(), out.begin(), out.end());
  };
  if (o.token_by_token) {
    for (int64_t p = 0; p < prefill; ++p) run(p, 1, nullptr);
  } else {
    run(0, prefill, o.hidden ? &r.hidden : nullptr);
  }
  for (int64_t p = prefill; p < T; ++p) run(p, 1, nullptr);
  return r;
}

struct EngineGenerateOptions {
  int64_t max_new_tokens = 16;
  int32_t page_size = 16;
  KvElem kv_elem = KvElem::F32;
  int threads = 2;
  engine::SamplingParams sampling = [] {
    engine::SamplingParams s;
    s.temperature = 0.0f;  // greedy
    s.has_seed = true;
    return s;
  }();
  int32_t speculative_steps = 0;
  model::DraftOverride draft_override;
  uint8_t dump = 0;  // engine::DumpRows
};

struct EngineGenerate {
  std::unique_ptr<engine::CpuModelBackend> backend;  // its pool holds the request's KV (pages 0, 1, ... in order)
  engine::OneRequestResult result;
  int64_t drafted = 0, accepted = 0;
  std::vector<int64_t> accept_length;  // [i]: speculative rounds that emitted i + 1 tokens
};

inline EngineGenerate generate_on_engine(const std::string& model_dir, const std::vector<int32_t>& prompt,
                                         const EngineGenerateOptions& o) {
  engine::CpuModelBackendOptions bo;
  bo.model_dir = model_dir;
  bo.threads = o.threads;
  bo.kv_elem = o.kv_elem;
  bo.speculative_steps = o.speculative_steps;
  bo.draft_override = o.draft_override;
  bo.mtp_layer = (o.dump & engine::kDumpMtpLogits) != 0;
  EngineGenerate g;
  g.backend = std::make_unique<engine::CpuModelBackend>(bo);
  engine::OneRequestObserver counter(o.speculative_steps);
  g.backend->set_observer(&counter);
  {
    engine::EngineOptions eo;
    eo.log_interval_rounds = 0;
    engine::Engine e(engine::one_request_config(int64_t(prompt.size()), o.max_new_tokens, o.page_size, o.speculative_steps),
                     *g.backend, eo);
    engine::RequestSpec rq;
    rq.prompt = prompt;
    rq.max_new_tokens = int32_t(o.max_new_tokens);
    rq.ignore_eos = true;
    rq.sampling = o.sampling;
    rq.dump = o.dump;
    g.result = engine::run_one_request(e, std::move(rq), &counter);
  }
  g.backend->set_observer(nullptr);
  g.drafted = counter.drafted;
  g.accepted = counter.accepted;
  g.accept_length = counter.accept_length;
  return g;
}

}  // namespace fp4moe::testing_model
