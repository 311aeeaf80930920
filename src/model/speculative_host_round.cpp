// MtpSpeculator::round's host form (speculative.hpp describes the algorithm): the draft choices,
// the acceptance and the catch-up over a backend's SpecSteps, with each request's host work
// (masks, draws, distributions, logprobs, traces, the MTP state copied out) on
// core/threads.hpp's pool. A request's work reads only its own rows, its own scratch and its
// own constraint, and its draws are fixed by (seed, output index): the results are the same
// bits for any thread count. The steps themselves, the speculator's maps (state_, queue_) and
// the callbacks (on_round, log lines) stay on the caller's thread; draft_override (a test
// hook) makes the round single-threaded.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "model/speculative.hpp"

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

// A buffer of at least n floats, kept between rounds (a fresh one of the verify step's size,
// 158 MB at B 64 and GLM-5's vocabulary, costs its page faults every round).
float* at_least(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

const std::vector<int32_t> kNoTokens;

}  // namespace

int MtpSpeculator::host_threads() const {
  return threads > 0 ? threads : std::min(default_num_threads(), kMaxHostThreads);
}

std::vector<SpecRoundResult> MtpSpeculator::round(const std::vector<SpecRequest>& reqs) {
  const int64_t H = steps_.config().hidden, V = steps_.config().vocab;
  const size_t R = reqs.size();
  std::vector<SpecRoundResult> out(R);
  if (R == 0) return out;
  run_queued();  // pairs that waited (settle_queued): the drafts start from the MTP layer's state after them
  if (device_rounds && device_round(reqs, out)) return out;
  ++host_round_count;
  const int th = draft_override ? 1 : host_threads();
  // The logits of a step: the backend's own host buffer where it lends it, else ours.
  const bool lent = steps_.lends_logits();
  auto logits_view = [&](std::vector<float>& buf, int64_t rows) {
    return lent ? TensorView{} : TensorView::of(at_least(buf, size_t(rows * V)), {rows, V});
  };
  auto logits_of = [&](const std::vector<float>& buf) {
    const float* l = lent ? steps_.last_logits() : buf.data();
    FP4MOE_CHECK(l, "speculative round: the backend lends its logits but has none");
    return l;
  };
  auto each = [&](size_t count, const std::function<void(size_t)>& fn) {
    parallel_for(int64_t(count), th, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(size_t(i));
    });
  };
  // One request's round. prompt / gen: the request's tokens for the penalties (copied once per
  // round, and only when it has penalties; gen grows by the drafts as they are chosen).
  struct Work {
    const State* st = nullptr;
    int32_t n = 0;
    std::vector<int32_t> drafts, prompt, gen;
    std::vector<cpu::SparseDistribution> q;  // sampled requests: the draft distributions
    std::vector<float> g;                    // the MTP hidden state of the last draft
    // Constrained requests: the masks of the grammar states after 0, 1, .. of its drafts ([W]
    // each; row k of the round, draft or verify, is masked by the k-th). A mask that allows
    // nothing is not applied (the engine's matcher then refuses the token drawn there; the
    // grammar compiler rules such states out).
    std::vector<uint32_t> masks;
    int32_t advanced = 0;  // drafts the constraint accepted (rolled back when the round ends)
    int32_t ended_at = -1;  // drafts after which the text ended
    std::optional<RoundTrace> trace;
  };
  std::vector<Work> w(R);
  if (masked_rows_.size() < R) masked_rows_.resize(R);
  for (size_t r = 0; r < R; ++r) {
    const SpecRequest& rq = reqs[r];
    FP4MOE_CHECK(rq.max_new >= 1, "speculative round: max_new {} for request {}", rq.max_new, rq.id);
    auto it = state_.find(rq.id);
    // A device round leaves the argmax of the MTP logits (draft_token), enough for an eligible request.
    const bool ready = it != state_.end() && it->second.mtp_pos == rq.start - 1 &&
                       (!it->second.draft_logits.empty() || (it->second.draft_token >= 0 && device_round_eligible(rq)));
    w[r].n = ready ? std::min(n_, rq.max_new - 1) : 0;
    if (ready) w[r].st = &it->second;
  }
  // Every constraint leaves the round in the state it came in, whatever happens.
  struct Restore {
    const std::vector<SpecRequest>& reqs;
    const std::vector<Work>& w;
    ~Restore() {
      for (size_t r = 0; r < reqs.size(); ++r)
        if (w[r].advanced > 0) reqs[r].constraint->rollback(w[r].advanced);
    }
  } restore{reqs, w};
  const int64_t W = (V + 31) / 32;
  auto push_mask = [&](size_t r) {  // appends the present state's mask; false when it allows nothing
    std::vector<uint32_t>& m = w[r].masks;
    m.resize(m.size() + size_t(W));
    const std::span<uint32_t> last(m.data() + m.size() - size_t(W), size_t(W));
    reqs[r].constraint->fill_mask(last);
    return std::any_of(last.begin(), last.end(), [](uint32_t x) { return x != 0; });
  };
  auto masked = [&](size_t r, int32_t k, const float* row) {  // row k of request r under its mask
    const std::vector<uint32_t>& ms = w[r].masks;
    if (!reqs[r].constraint || !row || int64_t(ms.size()) < (k + 1) * W) return row;
    const uint32_t* m = ms.data() + int64_t(k) * W;
    if (std::all_of(m, m + W, [](uint32_t x) { return x == 0; })) return row;
    std::vector<float>& scratch = masked_rows_[r];
    scratch.assign(row, row + V);
    cpu::apply_token_bitmask(scratch.data(), V, m);
    return static_cast<const float*>(scratch.data());
  };
  auto penalties = [&](size_t r) { return reqs[r].sampling.has_penalties(); };
  // The draft of request r at index k from the MTP logits row.
  auto choose = [&](size_t r, int32_t k, const float* row) {
    const SpecRequest& rq = reqs[r];
    Work& x = w[r];
    row = masked(r, k, row);
    cpu::SamplingParams p = rq.sampling;
    p.logprobs_top_n = -1;
    const std::vector<int32_t>& prompt = penalties(r) ? x.prompt : kNoTokens;
    const std::vector<int32_t>& gen = penalties(r) ? x.gen : kNoTokens;  // generated + the drafts so far
    int32_t tok;
    if (!row) {  // k = 0 after a device round: its argmax (an eligible request: the same draw)
      tok = x.st->draft_token;
    } else if (greedy(p)) {
      tok = cpu::sample_cpu(row, V, p, prompt, gen, rq.output_index + uint64_t(k)).token;
    } else {
      x.q.push_back(cpu::sampling_distribution_sparse(row, V, p, prompt, gen));
      tok = draw_from(x.q.back(), cpu::sampling_uniform(p.seed ^ kDraftStream, rq.output_index + uint64_t(k)));
    }
    if (draft_override) tok = draft_override(rq.id, rq.output_index + uint64_t(k), tok);
    FP4MOE_CHECK(tok >= 0 && tok < V, "draft token {} outside the vocabulary", tok);
    if (TokenConstraint* c = rq.constraint) {
      if (!c->accept(tok)) {  // refused by the grammar: the chain ends before it
        x.n = k;
        return;
      }
      ++x.advanced;
      x.drafts.push_back(tok);
      if (penalties(r)) x.gen.push_back(tok);
      const bool allows = push_mask(r);  // row k + 1's
      if (c->terminated()) x.ended_at = k + 1;
      if (!allows) x.n = k + 1;  // the text ended (or a dead end): nothing to draft from
      return;
    }
    x.drafts.push_back(tok);
    if (penalties(r)) x.gen.push_back(tok);
  };
  // 0. The first draft of every request (from its stored MTP logits), its first mask.
  auto t_host = std::chrono::steady_clock::now();
  each(R, [&](size_t r) {
    Work& x = w[r];
    if (penalties(r)) {
      x.prompt.assign(reqs[r].prompt.begin(), reqs[r].prompt.end());
      x.gen = reqs[r].generated;
    }
    if (reqs[r].constraint && !push_mask(r)) x.n = 0;
    if (x.n > 0) {
      choose(r, 0, x.st->draft_logits.empty() ? nullptr : x.st->draft_logits.data());
      if (x.n > 1) x.g = x.st->draft_hidden;
    }
  });
  int32_t longest = 0;
  for (const Work& x : w) longest = std::max(longest, x.n);
  times.host_draft += seconds_since(t_host);
  // 1. The chained draft steps k = 1 .. n − 1 (one token per request still drafting).
  const auto t_draft = std::chrono::steady_clock::now();
  for (int32_t k = 1; k < longest; ++k) {
    std::vector<size_t> who;
    std::vector<int32_t> tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows;
    std::vector<float> hin;
    for (size_t r = 0; r < R; ++r) {
      if (w[r].n <= k) continue;
      who.push_back(r);
      tokens.push_back(w[r].drafts[size_t(k) - 1]);
      pos.push_back(reqs[r].start + k - 1);
      qo.push_back(int32_t(tokens.size()));
      kv_len.push_back(reqs[r].start + k);
      pages.insert(pages.end(), reqs[r].pages.begin(), reqs[r].pages.end());
      page_ptr.push_back(int32_t(pages.size()));
      rows.push_back(int32_t(tokens.size()) - 1);
      hin.insert(hin.end(), w[r].g.begin(), w[r].g.end());
    }
    // A constrained chain shortens itself while it drafts (n drops when the grammar refuses a
    // draft or its text ends), so every chain can be done before k reaches the longest planned.
    if (who.empty()) break;
    const int64_t T = int64_t(tokens.size());
    float* hout = at_least(draft_hidden_, size_t(T * H));
    const KvBatchView b{T, T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    steps_.mtp(TensorView::of(tokens.data(), {T}), hin.data(), b, rows, logits_view(draft_logits_, T), hout);
    const float* logits = logits_of(draft_logits_);
    t_host = std::chrono::steady_clock::now();
    each(who.size(), [&](size_t i) {
      choose(who[i], k, logits + int64_t(i) * V);
      w[who[i]].g.assign(hout + int64_t(i) * H, hout + int64_t(i + 1) * H);
    });
    times.host_draft += seconds_since(t_host);
  }
  times.draft += seconds_since(t_draft);
  // 2. Verify: the target over [last, d_1 .. d_n] of every request, absorbed attention.
  const auto t_verify = std::chrono::steady_clock::now();
  std::vector<int32_t> tokens, pos, qo{0}, kv_len, page_ptr{0}, pages, rows, off(R);
  for (size_t r = 0; r < R; ++r) {
    const SpecRequest& rq = reqs[r];
    const int32_t n = w[r].n;
    FP4MOE_CHECK(int64_t(rq.pages.size()) * steps_.page_size() >= rq.start + n + 1,
                 "speculative round: request {} has pages for {} positions, the round writes {}", rq.id,
                 int64_t(rq.pages.size()) * steps_.page_size(), rq.start + n + 1);
    off[r] = int32_t(tokens.size());
    tokens.push_back(rq.last_token);
    tokens.insert(tokens.end(), w[r].drafts.begin(), w[r].drafts.end());
    for (int32_t k = 0; k <= n; ++k) {
      pos.push_back(rq.start + k);
      rows.push_back(off[r] + k);
    }
    qo.push_back(int32_t(tokens.size()));
    kv_len.push_back(rq.start + n + 1);
    pages.insert(pages.end(), rq.pages.begin(), rq.pages.end());
    page_ptr.push_back(int32_t(pages.size()));
  }
  const int64_t T = int64_t(tokens.size());
  t_host = std::chrono::steady_clock::now();
  const TensorView verify_view = logits_view(verify_logits_, T);
  float* hidden = at_least(verify_hidden_, size_t(T * H));
  times.host_buffers += seconds_since(t_host);
  // A backend with a device round catches the MTP layer up over every verify row, as the device
  // round does (the same bits either way); else the emitted pairs are queued (run_queued). No
  // pair of these requests waits here: round() ran them first.
  const bool rows_form = steps_.offers_catchup_over_verify_rows();
  {
    const KvBatchView b{int64_t(R), T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    steps_.verify(TensorView::of(tokens.data(), {T}), b, rows, verify_view, hidden);
  }
  const float* logits = logits_of(verify_logits_);  // read up to the catch-up step (which may reuse a lent buffer)
  times.verify += seconds_since(t_verify);
  // 3. Accept, 4. the stop / max_new cut (per request, on the pool), then the MTP layer over the
  // emitted pairs.
  t_host = std::chrono::steady_clock::now();
  each(R, [&](size_t r) {
    const SpecRequest& rq = reqs[r];
    Work& x = w[r];
    const int32_t n = x.n;
    const std::vector<int32_t>& prompt = penalties(r) ? x.prompt : kNoTokens;
    if (penalties(r)) x.gen = rq.generated;  // generated + the emitted tokens
    const std::vector<int32_t>& gen = penalties(r) ? x.gen : kNoTokens;
    SpecRoundResult& res = out[r];
    res.drafted = n;
    auto emit = [&](cpu::SampledToken&& t) {
      if (penalties(r)) x.gen.push_back(t.token);
      res.tokens.push_back(std::move(t));
      const int32_t tok = res.tokens.back().token;
      return std::find(rq.stop_ids.begin(), rq.stop_ids.end(), tok) != rq.stop_ids.end() ||
             int32_t(res.tokens.size()) >= rq.max_new;
    };
    for (int32_t k = 0; k <= n; ++k) {
      const float* row = masked(r, k, logits + int64_t(off[r] + k) * V);
      const uint64_t idx = rq.output_index + uint64_t(k);
      if (greedy(rq.sampling) || k == n) {  // greedy, or the bonus: the plain sampler's draw
        cpu::SampledToken s = cpu::sample_cpu(row, V, rq.sampling, prompt, gen, idx);
        const bool match = k < n && s.token == x.drafts[size_t(k)];
        const bool end = emit(std::move(s));
        if (!match) break;
        ++res.accepted;
        if (end || res.accepted == x.ended_at) break;
        continue;
      }
      const cpu::SparseDistribution p = cpu::sampling_distribution_sparse(row, V, rq.sampling, prompt, gen);
      const SampledVerdict v =
          verify_sampled(p, x.q[size_t(k)], x.drafts[size_t(k)], cpu::sampling_uniform(rq.sampling.seed ^ kAcceptStream, idx),
                         cpu::sampling_uniform(rq.sampling.seed ^ kResidualStream, idx));
      const bool end = emit(cpu::logprobs_of(row, V, rq.sampling, prompt, gen, v.token));
      if (!v.accepted) break;
      ++res.accepted;
      if (end || res.accepted == x.ended_at) break;
    }
    // A constrained token outside its row's mask (never, unless the row's logits were not finite
    // where the mask allows): the round's trace goes to the log. The scan is paid only then, or
    // when a test / diagnostics asked for every trace (on_round).
    bool outside = false;
    for (int32_t k = 0; rq.constraint && k < int32_t(res.tokens.size()); ++k)
      if (int64_t(x.masks.size()) >= (k + 1) * W) {
        const uint32_t* m = x.masks.data() + int64_t(k) * W;
        const int32_t tok = res.tokens[size_t(k)].token;
        outside = outside || (std::any_of(m, m + W, [](uint32_t u) { return u != 0; }) && !mask_allows(m, tok));
      }
    if (!outside && !on_round) return;
    RoundTrace& t = x.trace.emplace();
    t.id = rq.id;
    t.output_index = rq.output_index;
    t.start = rq.start;
    t.constrained = rq.constraint != nullptr;
    t.sampled = !greedy(rq.sampling);
    t.rows_form = rows_form;
    t.drafts = x.drafts;
    t.accepted = res.accepted;
    t.ended_at = x.ended_at;
    for (const cpu::SampledToken& e : res.tokens) t.emitted.push_back(e.token);
    for (int32_t k = 0; rq.constraint && k < int32_t(res.tokens.size()); ++k) {
      const float* row = logits + int64_t(off[r] + k) * V;
      const bool has = int64_t(x.masks.size()) >= (k + 1) * W;
      const uint32_t* m = has ? x.masks.data() + int64_t(k) * W : nullptr;
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
  });
  // The caller's thread, in request order: the log, the traces, the queued MTP pairs.
  for (size_t r = 0; r < R; ++r) {
    if (const std::optional<RoundTrace>& t = w[r].trace) {
      if (t->emitted_outside_mask()) log_warn("speculative round: a token outside its grammar mask: {}", t->describe());
      if (on_round) on_round(*t);
    }
    if (rows_form) continue;  // the catch-up over every verify row, below
    // The MTP pairs (h_{start+j}, emitted_j): h from the verify rows, whose inputs were
    // [last, emitted_0 .. emitted_{m-2}] (accepted drafts equal the emitted tokens).
    const int32_t m = int32_t(out[r].tokens.size());
    const std::span<const int32_t> inputs(tokens.data() + off[r], size_t(m));
    add_target_rows(reqs[r].id, reqs[r].start, inputs, hidden + int64_t(off[r]) * H, out[r].tokens.back().token,
                    reqs[r].pages);
  }
  times.host_accept += seconds_since(t_host);
  if (rows_form) {  // the device round's catch-up: every verify row, its target choice as the token
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> ctok(static_cast<size_t>(T));
    each(R, [&](size_t r) {
      const int32_t m = int32_t(out[r].tokens.size());
      for (int32_t j = 0; j <= w[r].n; ++j) {
        const float* row = logits + int64_t(off[r] + j) * V;
        ctok[size_t(off[r] + j)] = j < m ? out[r].tokens[size_t(j)].token : argmax_row(row, V);
      }
    });
    times.host_catchup += seconds_since(t0);
    t_host = std::chrono::steady_clock::now();
    const TensorView clog_view = logits_view(catchup_logits_, T);
    float* ch = at_least(catchup_hidden_, size_t(T * H));
    times.host_buffers += seconds_since(t_host);
    const KvBatchView b{int64_t(R), T, qo.data(), pos.data(), kv_len.data(), page_ptr.data(), pages.data()};
    FP4MOE_CHECK(steps_.catchup_over_verify_rows(TensorView::of(ctok.data(), {T}), hidden, b, clog_view, ch),
                 "speculative round: the backend stopped offering its catch-up");
    const float* clog = logits_of(catchup_logits_);
    t_host = std::chrono::steady_clock::now();
    std::vector<State*> st(R);
    for (size_t r = 0; r < R; ++r) {
      st[r] = &state_[reqs[r].id];  // inserted here, on one thread (the map's nodes stay put)
      queue_.erase(reqs[r].id);
    }
    each(R, [&](size_t r) {
      const int64_t last = off[r] + int64_t(out[r].tokens.size()) - 1;
      State& s = *st[r];
      s.mtp_pos = reqs[r].start + int32_t(out[r].tokens.size()) - 1;
      s.draft_logits.assign(clog + last * V, clog + (last + 1) * V);
      s.draft_token = -1;
      s.draft_hidden.assign(ch + last * H, ch + (last + 1) * H);
      s.pending_pos = -1;
    });
    times.host_catchup += seconds_since(t_host);
    times.mtp += seconds_since(t0);
  }
  run_queued();
  return out;
}

}  // namespace fp4moe::model
