#include "model/speculative.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/log.hpp"

namespace fp4moe::model {

std::string RoundTrace::describe() const {
  std::string s = fmt::format("request {} at output index {} (position {}, {}{}{}): drafts [{}], accepted {}, "
                              "ended_at {}, emitted [{}]",
                              id, output_index, start, sampled ? "sampled" : "greedy", constrained ? ", constrained" : "",
                              rows_form ? ", catch-up over verify rows" : "", fmt::join(drafts, " "), accepted, ended_at,
                              fmt::join(emitted, " "));
  for (size_t k = 0; k < allowed.size(); ++k)
    s += fmt::format("; row {}: {} allowed{}, {} non-finite, best allowed logit {}", k, allowed[k],
                     inside[k] ? "" : ", the emitted token NOT among them", nonfinite[k], best_logit[k]);
  return s;
}

int32_t draw_from(const std::vector<double>& dist, double u) {
  double total = 0.0;
  for (double x : dist) total += x;
  const double target = u * total;
  double c = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < dist.size(); ++i) {
    if (dist[i] <= 0.0) continue;
    last = int32_t(i);
    c += dist[i];
    if (c > target) return int32_t(i);
  }
  return last;
}

SampledVerdict verify_sampled(const std::vector<double>& p, const std::vector<double>& q, int32_t d, double u_accept,
                              double u_residual) {
  FP4MOE_CHECK(p.size() == q.size() && d >= 0 && size_t(d) < p.size(), "verify_sampled: draft {} of a {}-token vocabulary", d,
               p.size());
  if (q[size_t(d)] > 0.0 && u_accept * q[size_t(d)] < p[size_t(d)]) return {d, true};
  std::vector<double> resid(p.size());
  double mass = 0.0;
  for (size_t i = 0; i < p.size(); ++i) mass += resid[i] = std::max(0.0, p[i] - q[i]);
  return {draw_from(mass > 0.0 ? resid : p, u_residual), false};
}

int32_t draw_from(const cpu::SparseDistribution& dist, double u) {
  double total = 0.0;  // the dense sum in id order less its +0.0 terms: the same double
  for (double x : dist.prob) total += x;
  const double target = u * total;
  double c = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < dist.prob.size(); ++i) {
    if (dist.prob[i] <= 0.0) continue;
    last = dist.ids[i];
    c += dist.prob[i];
    if (c > target) return dist.ids[i];
  }
  return last;
}

SampledVerdict verify_sampled(const cpu::SparseDistribution& p, const cpu::SparseDistribution& q, int32_t d,
                              double u_accept, double u_residual) {
  FP4MOE_CHECK(p.vocab == q.vocab && d >= 0 && d < p.vocab, "verify_sampled: draft {} of a {}-token vocabulary", d,
               p.vocab);
  const double qd = q.at(d), pd = p.at(d);
  if (qd > 0.0 && u_accept * qd < pd) return {d, true};
  cpu::SparseDistribution resid;
  resid.vocab = p.vocab;
  resid.ids = p.ids;
  resid.prob.resize(p.prob.size());
  double mass = 0.0;
  size_t j = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    while (j < q.ids.size() && q.ids[j] < p.ids[i]) ++j;
    const double qi = j < q.ids.size() && q.ids[j] == p.ids[i] ? q.prob[j] : 0.0;
    mass += resid.prob[i] = std::max(0.0, p.prob[i] - qi);
  }
  return {draw_from(mass > 0.0 ? resid : p, u_residual), false};
}

ModelSpecSteps::ModelSpecSteps(Model& model, HostKvPool& kv, bool catchup_over_verify_rows)
    : model_(model), kv_(kv), catchup_(catchup_over_verify_rows) {
  FP4MOE_CHECK(model.has_mtp(), "speculative decoding needs the checkpoint's MTP layer (model.layers.{}.*), and it has none",
               model.config().num_layers);
  FP4MOE_CHECK(kv.geometry().num_layers == model.config().num_layers + 1,
               "speculative decoding: the KV pool has {} layers, expected {} (the MTP layer's included)",
               kv.geometry().num_layers, model.config().num_layers + 1);
}

void ModelSpecSteps::verify(const TensorView& tokens, const KvBatchView& b, const std::vector<int32_t>& rows,
                            const TensorView& logits, float* hidden) {
  StepExtras x;
  x.final_hidden = hidden;
  x.absorbed = true;
  model_.step(tokens, b, kv_, rows, logits, nullptr, x);
}

void ModelSpecSteps::mtp(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                         const std::vector<int32_t>& rows, const TensorView& logits, float* h_out) {
  model_.mtp_step(tokens, h_in, b, kv_, rows, logits, h_out);
}

bool ModelSpecSteps::catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                              const TensorView& logits, float* h_out) {
  if (!catchup_) return false;
  std::vector<int32_t> rows(static_cast<size_t>(b.num_tokens));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(i);
  model_.mtp_step(tokens, h_in, b, kv_, rows, logits, h_out);  // causal within a request: row j sees rows <= j
  return true;
}

MtpSpeculator::MtpSpeculator(Model& model, HostKvPool& kv, int32_t num_steps, bool catchup_over_verify_rows)
    : own_(std::make_unique<ModelSpecSteps>(model, kv, catchup_over_verify_rows)), steps_(*own_), n_(num_steps) {
  threads = model.options().threads;  // the CPU backend's thread option (0: the default)
  FP4MOE_CHECK(num_steps >= 1 && num_steps <= 16, "--speculative-num-steps {} must be in [1, 16]", num_steps);
}

MtpSpeculator::MtpSpeculator(SpecSteps& steps, int32_t num_steps) : steps_(steps), n_(num_steps) {
  FP4MOE_CHECK(num_steps >= 1 && num_steps <= 16, "--speculative-num-steps {} must be in [1, 16]", num_steps);
}

void MtpSpeculator::add_target_rows(uint64_t id, int32_t p0, std::span<const int32_t> tokens, const float* hidden,
                                    int32_t next, std::span<const int32_t> pages, bool keep_logits) {
  const int64_t H = steps_.config().hidden;
  const int32_t n = int32_t(tokens.size());
  if (n == 0) return;
  State& s = state_[id];
  Queued q;
  q.keep = keep_logits;
  q.pages.assign(pages.begin(), pages.end());
  if (s.pending_pos >= 0 && s.pending_pos == p0 - 1) {
    q.p0 = p0 - 1;
    q.hidden = s.pending_hidden;
    q.tokens.push_back(tokens[0]);
  } else {
    q.p0 = p0;
  }
  s.pending_pos = -1;
  for (int32_t j = 0; j + 1 < n; ++j) {
    q.hidden.insert(q.hidden.end(), hidden + int64_t(j) * H, hidden + int64_t(j + 1) * H);
    q.tokens.push_back(tokens[size_t(j) + 1]);
  }
  const float* last = hidden + int64_t(n - 1) * H;
  if (next >= 0) {
    q.hidden.insert(q.hidden.end(), last, last + H);
    q.tokens.push_back(next);
  } else {
    s.pending_pos = p0 + n - 1;
    s.pending_hidden.assign(last, last + H);
  }
  if (q.tokens.empty()) return;
  auto it = queue_.find(id);
  if (it == queue_.end()) {
    queue_.emplace(id, std::move(q));
    return;
  }
  // Pairs waiting from earlier steps (settle_queued): this step's continue them — after the
  // waiting ones ran, where together they would pass defer_rows (one request's pairs are one MTP
  // step, which a backend sizes for a step's tokens).
  Queued& w = it->second;
  FP4MOE_CHECK(w.p0 + int32_t(w.tokens.size()) == q.p0,
               "speculative: request {}: queued MTP pairs at positions [{}, {}) and new ones from {}", id, w.p0,
               w.p0 + int32_t(w.tokens.size()), q.p0);
  if (defer_rows > 0 && int64_t(w.tokens.size() + q.tokens.size()) > defer_rows) {
    run_queued_of({id});
    queue_.emplace(id, std::move(q));
    return;
  }
  w.tokens.insert(w.tokens.end(), q.tokens.begin(), q.tokens.end());
  w.hidden.insert(w.hidden.end(), q.hidden.begin(), q.hidden.end());
  w.pages = std::move(q.pages);  // the request's page table now (a superset of the earlier one)
  w.keep = w.keep || q.keep;
}

void MtpSpeculator::settle_queued() {
  int64_t rows = 0;
  bool keep = false;
  for (const auto& [id, q] : queue_) rows += int64_t(q.tokens.size()), keep = keep || q.keep;
  if (keep || rows > defer_rows) run_queued();
}

void MtpSpeculator::release(std::span<const uint64_t> ids) {
  std::vector<uint64_t> waiting;
  for (uint64_t id : ids)
    if (queue_.count(id)) waiting.push_back(id);
  try {
    if (!waiting.empty()) run_queued_of(waiting);
  } catch (const Error& e) {  // the requests are gone either way; only drafts that reuse their pages would read the rows
    log_warn("speculative: {} leaving request(s): waiting MTP pairs did not run ({}); their MTP KV rows stay unwritten",
             waiting.size(), e.what());
  }
  for (uint64_t id : ids) forget(id);
}

void MtpSpeculator::run_queued() {
  std::vector<uint64_t> ids;
  for (const auto& [id, q] : queue_) ids.push_back(id);
  run_queued_of(std::move(ids));
}

void MtpSpeculator::run_queued_of(std::vector<uint64_t> ids) {
  kept_.clear();
  std::sort(ids.begin(), ids.end());
  // MTP steps of at most defer_rows pairs where they can be split by request (0: one step).
  std::vector<uint64_t> group;
  int64_t rows = 0;
  for (uint64_t id : ids) {
    const int64_t n = int64_t(queue_.at(id).tokens.size());
    if (!group.empty() && defer_rows > 0 && rows + n > defer_rows) {
      run_queued_step(group);
      group.clear();
      rows = 0;
    }
    group.push_back(id);
    rows += n;
  }
  run_queued_step(group);
}

void MtpSpeculator::run_queued_step(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  ++queued_mtp_steps;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t H = steps_.config().hidden, V = steps_.config().vocab;
  std::vector<int32_t> tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows, last;  // last[i]: request i's draft row in rows
  std::vector<float> hin;
  for (uint64_t id : ids) {
    const Queued& q = queue_[id];
    for (size_t j = 0; j < q.tokens.size(); ++j) {
      if (q.keep) rows.push_back(int32_t(tokens.size()));
      tokens.push_back(q.tokens[j]);
      pos.push_back(q.p0 + int32_t(j));
    }
    hin.insert(hin.end(), q.hidden.begin(), q.hidden.end());
    qo.push_back(int32_t(tokens.size()));
    kv_len.push_back(q.p0 + int32_t(q.tokens.size()));
    pages.insert(pages.end(), q.pages.begin(), q.pages.end());
    page_ptr.push_back(int32_t(pages.size()));
    if (!q.keep) rows.push_back(int32_t(tokens.size()) - 1);
    last.push_back(int32_t(rows.size()) - 1);
  }
  const int64_t T = int64_t(tokens.size());
  std::vector<float> logits(rows.size() * size_t(V)), hout(static_cast<size_t>(T * H));
  const KvBatchView b{int64_t(ids.size()), T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
  for (uint64_t id : ids) {
    const Queued& q = queue_[id];
    if (q.keep) kept_[id].start = q.p0;
  }
  for (uint64_t id : ids) queue_.erase(id);
  steps_.mtp(TensorView::of(tokens.data(), {T}), hin.data(), b, rows,
             TensorView::of(logits.data(), {int64_t(rows.size()), V}), hout.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    State& s = state_[ids[i]];
    const int64_t k = last[i], row = rows[size_t(k)];
    s.mtp_pos = pos[size_t(row)];
    s.draft_logits.assign(logits.begin() + k * V, logits.begin() + (k + 1) * V);
    s.draft_token = -1;
    s.draft_hidden.assign(hout.begin() + row * H, hout.begin() + (row + 1) * H);
    if (auto it = kept_.find(ids[i]); it != kept_.end()) {
      const int64_t first = i == 0 ? 0 : last[i - 1] + 1;
      it->second.logits.assign(logits.begin() + first * V, logits.begin() + (k + 1) * V);
    }
  }
  times.mtp += seconds_since(t0);
}

std::vector<float> MtpSpeculator::take_logits(uint64_t id, int32_t* start) {
  auto it = kept_.find(id);
  if (it == kept_.end()) return {};
  *start = it->second.start;
  std::vector<float> out = std::move(it->second.logits);
  kept_.erase(it);
  return out;
}

bool device_round_eligible(const SpecRequest& r) {
  return r.sampling.greedy() && !r.sampling.has_penalties() && r.sampling.logprobs_top_n < 0 && !r.constraint;
}

bool MtpSpeculator::device_round(const std::vector<SpecRequest>& reqs, std::vector<SpecRoundResult>& out) {
  if (draft_override || reqs.empty() || !steps_.offers_greedy_round()) return false;
  for (const SpecRequest& rq : reqs) {
    if (!device_round_eligible(rq)) return false;  // (no pair waits: round() ran them before this)
    if (auto it = state_.find(rq.id); it != state_.end() && it->second.pending_pos >= 0) return false;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t H = steps_.config().hidden, V = steps_.config().vocab;
  const size_t R = reqs.size();
  GreedyRoundInput in;
  in.max_drafts = n_;
  std::vector<float> hidden(R * size_t(H), 0.0f);
  for (size_t r = 0; r < R; ++r) {
    const SpecRequest& rq = reqs[r];
    FP4MOE_CHECK(rq.max_new >= 1, "speculative round: max_new {} for request {}", rq.max_new, rq.id);
    auto it = state_.find(rq.id);
    const bool ready = it != state_.end() && it->second.mtp_pos == rq.start - 1 &&
                       (!it->second.draft_logits.empty() || it->second.draft_token >= 0);
    const int32_t n = ready ? std::min(n_, rq.max_new - 1) : 0;
    int32_t first = -1;
    if (n > 0) {
      const State& st = it->second;
      // The host round's first draft: sample_cpu's greedy draw (the argmax, ties to the lower id).
      first = st.draft_logits.empty()
                  ? st.draft_token
                  : cpu::sample_cpu(st.draft_logits.data(), V, rq.sampling, {}, {}, rq.output_index).token;
      std::copy(st.draft_hidden.begin(), st.draft_hidden.end(), hidden.begin() + int64_t(r) * H);
    }
    in.start.push_back(rq.start);
    in.last_token.push_back(rq.last_token);
    in.first_draft.push_back(first);
    in.num_drafts.push_back(n);
    in.max_new.push_back(rq.max_new);
    in.pages.emplace_back(rq.pages.begin(), rq.pages.end());
    in.stop_ids.emplace_back(rq.stop_ids.begin(), rq.stop_ids.end());
  }
  in.draft_hidden = hidden.data();
  GreedyRoundOutput o;
  if (!steps_.greedy_round(in, o)) return false;
  const int64_t W = n_ + 1;
  FP4MOE_CHECK(o.count.size() == R && o.tokens.size() == R * size_t(W) && o.next_hidden.size() == R * size_t(H),
               "speculative round: the backend's device round returned {} results for {} requests", o.count.size(), R);
  out.assign(R, SpecRoundResult{});
  for (size_t r = 0; r < R; ++r) {
    const int32_t m = o.count[r];
    FP4MOE_CHECK(m >= 1 && m <= in.num_drafts[r] + 1, "speculative round: request {}: {} tokens from the device round",
                 reqs[r].id, m);
    SpecRoundResult& res = out[r];
    res.drafted = in.num_drafts[r];
    res.accepted = o.accepted[r];
    for (int32_t k = 0; k < m; ++k) {
      cpu::SampledToken t;
      t.token = o.tokens[r * size_t(W) + size_t(k)];
      t.kept = 1;
      res.tokens.push_back(std::move(t));
    }
    State& st = state_[reqs[r].id];
    st.mtp_pos = reqs[r].start + m - 1;
    st.draft_logits.clear();
    st.draft_token = o.next_draft[r];
    st.draft_hidden.assign(o.next_hidden.begin() + int64_t(r) * H, o.next_hidden.begin() + int64_t(r + 1) * H);
    st.pending_pos = -1;
  }
  ++device_round_count;
  times.device_round += seconds_since(t0);
  return true;
}

}  // namespace fp4moe::model
