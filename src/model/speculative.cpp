#include "model/speculative.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/log.hpp"

namespace fp4moe::model {
namespace {

// The three draw streams of a sampled round, apart from the plain sampler's (seed, index).
constexpr uint64_t kDraftStream = 0x6d74702d64726166ull;     // "mtp-draf"
constexpr uint64_t kAcceptStream = 0x6d74702d61636370ull;    // "mtp-accp"
constexpr uint64_t kResidualStream = 0x6d74702d72657369ull;  // "mtp-resi"

bool greedy(const cpu::SamplingParams& p) { return p.greedy(); }

// Whether token t is set in a grammar bitmask (32 tokens per word, the low bit first).
bool mask_allows(const uint32_t* m, int64_t t) { return (m[t / 32] >> (t % 32)) & 1u; }

// The first highest logit (the device's argmax_rows_f32 rule: ties to the lower id; NaN never wins).
int32_t argmax_row(const float* row, int64_t V) {
  int32_t best = 0;
  float bv = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (int64_t v = 0; v < V; ++v)
    if (!std::isnan(row[v]) && (!any || row[v] > bv)) bv = row[v], best = int32_t(v), any = true;
  return best;
}

}  // namespace

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
  if (!q.tokens.empty()) queue_[id] = std::move(q);
}

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void MtpSpeculator::run_queued() {
  if (queue_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t H = steps_.config().hidden, V = steps_.config().vocab;
  std::vector<uint64_t> ids;
  for (const auto& [id, q] : queue_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
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
  kept_.clear();
  for (uint64_t id : ids) {
    const Queued& q = queue_[id];
    if (q.keep) kept_[id].start = q.p0;
  }
  queue_.clear();
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
  times.mtp += since(t0);
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
    if (!device_round_eligible(rq) || queue_.count(rq.id)) return false;  // queued pairs: the host round's run_queued
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
  times.device_round += since(t0);
  return true;
}

std::vector<SpecRoundResult> MtpSpeculator::round(const std::vector<SpecRequest>& reqs) {
  const int64_t H = steps_.config().hidden, V = steps_.config().vocab;
  const size_t R = reqs.size();
  std::vector<SpecRoundResult> out(R);
  if (R == 0) return out;
  if (device_rounds && device_round(reqs, out)) return out;
  ++host_round_count;
  std::vector<int32_t> n(R, 0);
  std::vector<std::vector<int32_t>> drafts(R);
  std::vector<std::vector<std::vector<double>>> q(R);  // sampled requests: the draft distributions
  std::vector<std::vector<float>> g(R);                // the MTP hidden state of the last draft
  for (size_t r = 0; r < R; ++r) {
    const SpecRequest& rq = reqs[r];
    FP4MOE_CHECK(rq.max_new >= 1, "speculative round: max_new {} for request {}", rq.max_new, rq.id);
    auto it = state_.find(rq.id);
    // A device round leaves the argmax of the MTP logits (draft_token), enough for an eligible request.
    const bool ready = it != state_.end() && it->second.mtp_pos == rq.start - 1 &&
                       (!it->second.draft_logits.empty() || (it->second.draft_token >= 0 && device_round_eligible(rq)));
    n[r] = ready ? std::min(n_, rq.max_new - 1) : 0;
    if (n[r] > 0) g[r] = it->second.draft_hidden;
  }
  // Constrained requests: masks[r] holds the masks of the grammar states after 0, 1, .. of its
  // drafts ([W] each; row k of the round, draft or verify, is masked by the k-th). A mask that
  // allows nothing is not applied (the engine's matcher then refuses the token drawn there; the
  // grammar compiler rules such states out). Every constraint leaves the round in the state it
  // came in, whatever happens (advanced[r]: the drafts it accepted).
  const int64_t W = (V + 31) / 32;
  std::vector<std::vector<uint32_t>> masks(R);
  std::vector<int32_t> advanced(R, 0), ended_at(R, -1);  // ended_at: drafts after which the text ended
  struct Restore {
    const std::vector<SpecRequest>& reqs;
    const std::vector<int32_t>& advanced;
    ~Restore() {
      for (size_t r = 0; r < reqs.size(); ++r)
        if (advanced[r] > 0) reqs[r].constraint->rollback(advanced[r]);
    }
  } restore{reqs, advanced};
  auto push_mask = [&](size_t r) {  // appends the present state's mask; false when it allows nothing
    std::vector<uint32_t>& m = masks[r];
    m.resize(m.size() + size_t(W));
    const std::span<uint32_t> last(m.data() + m.size() - size_t(W), size_t(W));
    reqs[r].constraint->fill_mask(last);
    return std::any_of(last.begin(), last.end(), [](uint32_t w) { return w != 0; });
  };
  std::vector<float> masked_row;
  auto masked = [&](size_t r, int32_t k, const float* row) {  // row k of request r under its mask
    if (!reqs[r].constraint || int64_t(masks[r].size()) < (k + 1) * W) return row;
    const uint32_t* m = masks[r].data() + int64_t(k) * W;
    if (std::all_of(m, m + W, [](uint32_t w) { return w == 0; })) return row;
    masked_row.assign(row, row + V);
    cpu::apply_token_bitmask(masked_row.data(), V, m);
    return static_cast<const float*>(masked_row.data());
  };
  for (size_t r = 0; r < R; ++r)
    if (reqs[r].constraint && !push_mask(r)) n[r] = 0;
  // The draft of request r at index k from the MTP logits row.
  auto choose = [&](size_t r, int32_t k, const float* row) {
    const SpecRequest& rq = reqs[r];
    row = masked(r, k, row);
    std::vector<int32_t> gen = rq.generated;
    gen.insert(gen.end(), drafts[r].begin(), drafts[r].end());
    cpu::SamplingParams p = rq.sampling;
    p.logprobs_top_n = -1;
    int32_t tok;
    if (!row) {  // k = 0 after a device round: its argmax (an eligible request: the same draw)
      tok = state_[rq.id].draft_token;
    } else if (greedy(p)) {
      tok = cpu::sample_cpu(row, V, p, {rq.prompt.begin(), rq.prompt.end()}, gen, rq.output_index + uint64_t(k)).token;
    } else {
      q[r].push_back(cpu::sampling_distribution(row, V, p, {rq.prompt.begin(), rq.prompt.end()}, gen));
      tok = draw_from(q[r].back(), cpu::sampling_uniform(p.seed ^ kDraftStream, rq.output_index + uint64_t(k)));
    }
    if (draft_override) tok = draft_override(rq.id, rq.output_index + uint64_t(k), tok);
    FP4MOE_CHECK(tok >= 0 && tok < V, "draft token {} outside the vocabulary", tok);
    if (TokenConstraint* c = rq.constraint) {
      if (!c->accept(tok)) {  // refused by the grammar: the chain ends before it
        n[r] = k;
        return;
      }
      ++advanced[r];
      drafts[r].push_back(tok);
      const bool allows = push_mask(r);  // row k + 1's
      if (c->terminated()) ended_at[r] = k + 1;
      if (!allows) n[r] = k + 1;  // the text ended (or a dead end): nothing to draft from
      return;
    }
    drafts[r].push_back(tok);
  };
  int32_t longest = 0;
  auto t_host = std::chrono::steady_clock::now();
  for (size_t r = 0; r < R; ++r) {
    if (n[r] > 0) {
      const State& st = state_[reqs[r].id];
      choose(r, 0, st.draft_logits.empty() ? nullptr : st.draft_logits.data());
    }
    longest = std::max(longest, n[r]);
  }
  times.host_draft += since(t_host);
  // 1. The chained draft steps k = 1 .. n − 1 (one token per request still drafting).
  const auto t_draft = std::chrono::steady_clock::now();
  for (int32_t k = 1; k < longest; ++k) {
    std::vector<size_t> who;
    std::vector<int32_t> tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows;
    std::vector<float> hin;
    for (size_t r = 0; r < R; ++r) {
      if (n[r] <= k) continue;
      who.push_back(r);
      tokens.push_back(drafts[r][size_t(k) - 1]);
      pos.push_back(reqs[r].start + k - 1);
      qo.push_back(int32_t(tokens.size()));
      kv_len.push_back(reqs[r].start + k);
      pages.insert(pages.end(), reqs[r].pages.begin(), reqs[r].pages.end());
      page_ptr.push_back(int32_t(pages.size()));
      rows.push_back(int32_t(tokens.size()) - 1);
      hin.insert(hin.end(), g[r].begin(), g[r].end());
    }
    // A constrained chain shortens itself while it drafts (n[r] drops when the grammar refuses a
    // draft or its text ends), so every chain can be done before k reaches the longest planned.
    if (who.empty()) break;
    const int64_t T = int64_t(tokens.size());
    std::vector<float> logits(static_cast<size_t>(T * V)), hout(static_cast<size_t>(T * H));
    const KvBatchView b{T, T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    steps_.mtp(TensorView::of(tokens.data(), {T}), hin.data(), b, rows, TensorView::of(logits.data(), {T, V}),
               hout.data());
    t_host = std::chrono::steady_clock::now();
    for (size_t i = 0; i < who.size(); ++i) {
      choose(who[i], k, logits.data() + int64_t(i) * V);
      g[who[i]].assign(hout.begin() + int64_t(i) * H, hout.begin() + int64_t(i + 1) * H);
    }
    times.host_draft += since(t_host);
  }
  times.draft += since(t_draft);
  // 2. Verify: the target over [last, d_1 .. d_n] of every request, absorbed attention.
  const auto t_verify = std::chrono::steady_clock::now();
  std::vector<int32_t> tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows, off(R);
  for (size_t r = 0; r < R; ++r) {
    const SpecRequest& rq = reqs[r];
    FP4MOE_CHECK(int64_t(rq.pages.size()) * steps_.page_size() >= rq.start + n[r] + 1,
                 "speculative round: request {} has pages for {} positions, the round writes {}", rq.id,
                 int64_t(rq.pages.size()) * steps_.page_size(), rq.start + n[r] + 1);
    off[r] = int32_t(tokens.size());
    tokens.push_back(rq.last_token);
    tokens.insert(tokens.end(), drafts[r].begin(), drafts[r].end());
    for (int32_t k = 0; k <= n[r]; ++k) {
      pos.push_back(rq.start + k);
      rows.push_back(off[r] + k);
    }
    qo.push_back(int32_t(tokens.size()));
    kv_len.push_back(rq.start + n[r] + 1);
    pages.insert(pages.end(), rq.pages.begin(), rq.pages.end());
    page_ptr.push_back(int32_t(pages.size()));
  }
  const int64_t T = int64_t(tokens.size());
  t_host = std::chrono::steady_clock::now();
  std::vector<float> logits(static_cast<size_t>(T * V)), hidden(static_cast<size_t>(T * H));
  times.host_buffers += since(t_host);
  // A backend with a device round catches the MTP layer up over every verify row, as the device
  // round does (the same bits either way); else the emitted pairs are queued (run_queued).
  const bool rows_form = steps_.offers_catchup_over_verify_rows() && !std::any_of(reqs.begin(), reqs.end(), [&](const SpecRequest& q) {
    return queue_.count(q.id) > 0;
  });
  {
    const KvBatchView b{int64_t(R), T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    steps_.verify(TensorView::of(tokens.data(), {T}), b, rows, TensorView::of(logits.data(), {T, V}), hidden.data());
  }
  times.verify += since(t_verify);
  // 3. Accept, 4. the stop / max_new cut, then the MTP layer over the emitted pairs.
  t_host = std::chrono::steady_clock::now();
  for (size_t r = 0; r < R; ++r) {
    const SpecRequest& rq = reqs[r];
    const std::vector<int32_t> prompt(rq.prompt.begin(), rq.prompt.end());
    std::vector<int32_t> gen = rq.generated;
    SpecRoundResult& res = out[r];
    res.drafted = n[r];
    auto emit = [&](cpu::SampledToken&& t) {
      gen.push_back(t.token);
      res.tokens.push_back(std::move(t));
      const int32_t tok = res.tokens.back().token;
      return std::find(rq.stop_ids.begin(), rq.stop_ids.end(), tok) != rq.stop_ids.end() ||
             int32_t(res.tokens.size()) >= rq.max_new;
    };
    for (int32_t k = 0; k <= n[r]; ++k) {
      const float* row = masked(r, k, logits.data() + int64_t(off[r] + k) * V);
      const uint64_t idx = rq.output_index + uint64_t(k);
      if (greedy(rq.sampling) || k == n[r]) {  // greedy, or the bonus: the plain sampler's draw
        cpu::SampledToken s = cpu::sample_cpu(row, V, rq.sampling, prompt, gen, idx);
        const bool match = k < n[r] && s.token == drafts[r][size_t(k)];
        const bool end = emit(std::move(s));
        if (!match) break;
        ++res.accepted;
        if (end || res.accepted == ended_at[r]) break;
        continue;
      }
      const std::vector<double> p = cpu::sampling_distribution(row, V, rq.sampling, prompt, gen);
      const SampledVerdict v =
          verify_sampled(p, q[r][size_t(k)], drafts[r][size_t(k)], cpu::sampling_uniform(rq.sampling.seed ^ kAcceptStream, idx),
                         cpu::sampling_uniform(rq.sampling.seed ^ kResidualStream, idx));
      const bool end = emit(cpu::logprobs_of(row, V, rq.sampling, prompt, gen, v.token));
      if (!v.accepted) break;
      ++res.accepted;
      if (end || res.accepted == ended_at[r]) break;
    }
    // A constrained token outside its row's mask (never, unless the row's logits were not finite
    // where the mask allows): the round's trace goes to the log. The scan is paid only then, or
    // when a test / diagnostics asked for every trace (on_round).
    bool outside = false;
    for (int32_t k = 0; rq.constraint && k < int32_t(res.tokens.size()); ++k)
      if (int64_t(masks[r].size()) >= (k + 1) * W) {
        const uint32_t* m = masks[r].data() + int64_t(k) * W;
        const int32_t tok = res.tokens[size_t(k)].token;
        outside = outside || (std::any_of(m, m + W, [](uint32_t w) { return w != 0; }) && !mask_allows(m, tok));
      }
    if (outside || on_round) {
      RoundTrace t;
      t.id = rq.id;
      t.output_index = rq.output_index;
      t.start = rq.start;
      t.constrained = rq.constraint != nullptr;
      t.sampled = !greedy(rq.sampling);
      t.rows_form = rows_form;
      t.drafts = drafts[r];
      t.accepted = res.accepted;
      t.ended_at = ended_at[r];
      for (const cpu::SampledToken& e : res.tokens) t.emitted.push_back(e.token);
      for (int32_t k = 0; rq.constraint && k < int32_t(res.tokens.size()); ++k) {
        const float* row = logits.data() + int64_t(off[r] + k) * V;
        const bool has = int64_t(masks[r].size()) >= (k + 1) * W;
        const uint32_t* m = has ? masks[r].data() + int64_t(k) * W : nullptr;
        int32_t allowed = 0, nonfinite = 0;
        float best = -std::numeric_limits<float>::infinity();
        for (int64_t v = 0; m && v < V; ++v)
          if (mask_allows(m, v)) {
            ++allowed;
            if (!std::isfinite(row[v])) ++nonfinite;
            else best = std::max(best, row[v]);
          }
        const int32_t tok = res.tokens[size_t(k)].token;
        t.allowed.push_back(allowed > 0 ? allowed : -1);
        t.inside.push_back(allowed == 0 || mask_allows(m, tok));
        t.nonfinite.push_back(nonfinite);
        t.best_logit.push_back(best);
      }
      if (t.emitted_outside_mask()) log_warn("speculative round: a token outside its grammar mask: {}", t.describe());
      if (on_round) on_round(t);
    }
    if (rows_form) continue;  // the catch-up over every verify row, below
    // The MTP pairs (h_{start+j}, emitted_j): h from the verify rows, whose inputs were
    // [last, emitted_0 .. emitted_{m-2}] (accepted drafts equal the emitted tokens).
    const int32_t m = int32_t(res.tokens.size());
    std::vector<int32_t> inputs(tokens.begin() + off[r], tokens.begin() + off[r] + m);
    add_target_rows(rq.id, rq.start, inputs, hidden.data() + int64_t(off[r]) * H, res.tokens.back().token, rq.pages);
  }
  times.host_accept += since(t_host);
  if (rows_form) {  // the device round's catch-up: every verify row, its target choice as the token
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> ctok(static_cast<size_t>(T));
    for (size_t r = 0; r < R; ++r) {
      const int32_t m = int32_t(out[r].tokens.size());
      for (int32_t j = 0; j <= n[r]; ++j) {
        const float* row = logits.data() + int64_t(off[r] + j) * V;
        ctok[size_t(off[r] + j)] = j < m ? out[r].tokens[size_t(j)].token : argmax_row(row, V);
      }
    }
    times.host_catchup += since(t0);
    t_host = std::chrono::steady_clock::now();
    std::vector<float> clog(static_cast<size_t>(T * V)), ch(static_cast<size_t>(T * H));
    times.host_buffers += since(t_host);
    const KvBatchView b{int64_t(R), T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    FP4MOE_CHECK(steps_.catchup_over_verify_rows(TensorView::of(ctok.data(), {T}), hidden.data(), b,
                                                 TensorView::of(clog.data(), {T, V}), ch.data()),
                 "speculative round: the backend stopped offering its catch-up");
    t_host = std::chrono::steady_clock::now();
    for (size_t r = 0; r < R; ++r) {
      const int64_t last = off[r] + int64_t(out[r].tokens.size()) - 1;
      State& st = state_[reqs[r].id];
      st.mtp_pos = reqs[r].start + int32_t(out[r].tokens.size()) - 1;
      st.draft_logits.assign(clog.begin() + last * V, clog.begin() + (last + 1) * V);
      st.draft_token = -1;
      st.draft_hidden.assign(ch.begin() + last * H, ch.begin() + (last + 1) * H);
      st.pending_pos = -1;
      queue_.erase(reqs[r].id);
    }
    times.host_catchup += since(t_host);
    times.mtp += since(t0);
  }
  run_queued();
  return out;
}

}  // namespace fp4moe::model
