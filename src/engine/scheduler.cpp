#include "engine/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "engine/mask_filler.hpp"

namespace fp4moe::engine {

struct Scheduler::Sequence {
  uint64_t id = 0;
  RequestSpec spec;
  std::vector<int32_t> tokens;  // prompt, then generated
  int32_t prompt_len = 0;
  int32_t kv_len = 0;           // positions [0, kv_len) have KV in pages
  std::vector<int32_t> pages;   // page table; one pool reference per entry
  int32_t indexed_pages = 0;    // leading pages indexed in the prefix cache
  int32_t cached_tokens = -1;   // prefix-cache hit at first admission (usage)
  bool done = false;
  FinishReason reason = FinishReason::kLength;
  int32_t matched_stop = -1;
  int32_t verify_steps = 0;     // speculative draft/verify rounds (usage)
  std::vector<GeneratedToken> fresh;  // produced this round, not yet emitted
  std::string abort_message;          // why, when reason is kAbort
  // Constrained decoding: the grammar's state after the generated tokens, and the bitmask of
  // the next token (filled before each step that samples, or during its forward).
  std::optional<grammar::Matcher> matcher;
  std::vector<uint32_t> mask;
  std::vector<RowDump> dumps;  // RequestSpec::dump: rows computed, not yet emitted

  // The dump bits of a step that computes its pending tokens: the logits always, the hidden
  // states and MTP logits while it computes prompt positions.
  uint8_t step_dump() const {
    return uint8_t(spec.dump & (kDumpLogits | (kv_len < prompt_len ? (kDumpHidden | kDumpMtpLogits) : 0)));
  }
  // The grammar allowed no token this step (the fill then allows every token; the row's token
  // is dropped and the request aborted after the step). Compile-time checks keep it from
  // happening (grammar/dead_ends.hpp); this is the backstop.
  bool mask_empty = false;

  int32_t generated() const { return int32_t(tokens.size()) - prompt_len; }
  int32_t pending() const { return int32_t(tokens.size()) - kv_len; }
  int32_t remaining() const { return spec.max_new_tokens - generated(); }
  // Positions this request ever writes: the last generated token is never fed back.
  int64_t max_positions() const { return int64_t(prompt_len) + spec.max_new_tokens - 1; }
};

Scheduler::Scheduler(SchedulerConfig config, Backend& backend)
    : cfg_(std::move(config)), backend_(backend), pool_(cfg_.num_pages), cache_(pool_, cfg_.page_size) {
  FP4MOE_CHECK(cfg_.max_running >= 1, "--max-running-requests must be at least 1 (got {})", cfg_.max_running);
  FP4MOE_CHECK(cfg_.chunked_prefill_size >= 1, "--chunked-prefill-size must be at least 1 (got {})",
               cfg_.chunked_prefill_size);
  FP4MOE_CHECK(cfg_.decode_steps >= 1, "--num-continuous-decode-steps must be at least 1 (got {})", cfg_.decode_steps);
  FP4MOE_CHECK(cfg_.speculative_tokens == 0 || (cfg_.speculative_tokens >= 2 && cfg_.decode_steps == 1),
               "speculative decoding ({} tokens per verify step) runs one draft/verify round per decode call: "
               "--num-continuous-decode-steps must be 1 (got {})", cfg_.speculative_tokens, cfg_.decode_steps);
  FP4MOE_CHECK(cfg_.speculative_disable_by_batch_size >= 0 &&
                   (cfg_.speculative_disable_by_batch_size == 0 || cfg_.speculative_tokens > 0),
               "--speculative-disable-by-batch-size {} needs speculative decoding and must be at least 1",
               cfg_.speculative_disable_by_batch_size);
  FP4MOE_CHECK(cfg_.context_length >= 2, "the context length must be at least 2 (got {})", cfg_.context_length);
  batch_.page_size = cfg_.page_size;
  totals_.pages_total = cfg_.num_pages;
}

Scheduler::~Scheduler() = default;

void Scheduler::add(uint64_t id, RequestSpec spec) {
  FP4MOE_CHECK(!spec.prompt.empty(), "request {}: empty prompt", id);
  FP4MOE_CHECK(spec.max_new_tokens >= 1, "request {}: max_new_tokens {} < 1", id, spec.max_new_tokens);
  const int64_t total = int64_t(spec.prompt.size()) + spec.max_new_tokens;
  FP4MOE_CHECK(total <= cfg_.context_length && total <= int64_t(cfg_.num_pages) * cfg_.page_size,
               "request {}: {} prompt + {} new tokens exceed the context ({}) or the KV pool ({} tokens)", id,
               spec.prompt.size(), spec.max_new_tokens, cfg_.context_length, int64_t(cfg_.num_pages) * cfg_.page_size);
  const uint8_t dumps = backend_.info().dumps_rows;
  FP4MOE_CHECK((spec.dump & ~dumps) == 0, "request {}: the {} backend does not hand back the rows asked for (dump {:#x}, "
               "it offers {:#x})", id, backend_.info().name, spec.dump, dumps);
  auto s = std::make_unique<Sequence>();
  s->id = id;
  if (spec.grammar) {
    FP4MOE_CHECK(backend_.info().applies_token_masks, "request {}: the {} backend does not apply grammar masks", id,
                 backend_.info().name);
    s->matcher.emplace(spec.grammar);
    FP4MOE_CHECK(s->matcher->vocab_size() == backend_.info().vocab_size,
                 "request {}: its grammar was compiled for {} tokens, the model has {}", id, s->matcher->vocab_size(),
                 backend_.info().vocab_size);
    s->mask.resize(size_t(grammar::mask_words(s->matcher->vocab_size())));
  }
  s->tokens = spec.prompt;
  s->prompt_len = int32_t(spec.prompt.size());
  s->spec = std::move(spec);
  waiting_.push_back(std::move(s));
}

bool Scheduler::is_stop(const Sequence& s, int32_t token) const {
  auto has = [token](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), token) != v.end(); };
  return has(s.spec.stop_ids) || (!s.spec.ignore_eos && has(cfg_.eos_ids));
}

SampleSpec Scheduler::sample_spec(const Sequence& s) const {
  SampleSpec sp;
  sp.params = &s.spec.sampling;
  sp.output_index = s.generated();
  sp.prompt = {s.tokens.data(), size_t(s.prompt_len)};
  sp.generated = {s.tokens.data() + s.prompt_len, size_t(s.generated())};
  return sp;
}

bool Scheduler::ensure_pages(Sequence& s, int64_t positions) {
  const int32_t need = pages_for_tokens(positions, cfg_.page_size) - int32_t(s.pages.size());
  if (need <= 0) return true;
  if (pool_.num_free() < need && cfg_.radix_cache) cache_.evict(need - pool_.num_free());
  return pool_.allocate(need, s.pages);
}

void Scheduler::cache_prefix(Sequence& s) {
  const int32_t full = std::min<int32_t>(s.kv_len / cfg_.page_size, int32_t(s.pages.size()));
  if (!cfg_.radix_cache || full <= s.indexed_pages) return;
  cache_.insert(s.tokens, full, s.pages);
  s.indexed_pages = full;
}

void Scheduler::release(Sequence& s, bool backend_told) {
  cache_prefix(s);
  if (!backend_told && !s.pages.empty()) backend_.release_requests(std::span(&s.id, 1));
  pool_.release(s.pages);
  s.pages.clear();
  s.kv_len = 0;
  s.indexed_pages = 0;
}

void Scheduler::retract(size_t index) {
  SeqPtr s = std::move(running_[index]);
  running_.erase(running_.begin() + int64_t(index));
  release(*s);
  ++totals_.retractions;
  retracted_ = true;
  waiting_.push_front(std::move(s));
}

bool Scheduler::try_admit(Sequence& s, int32_t& evictable, int32_t reserved) {
  FP4MOE_CHECK(s.pages.empty() && s.kv_len == 0, "request {} admitted while holding pages", s.id);
  int32_t matched = 0, lost = 0;
  if (cfg_.radix_cache) {
    matched = cache_.match(s.tokens, (int32_t(s.tokens.size()) - 1) / cfg_.page_size, s.pages);
    for (int32_t p : s.pages) lost += pool_.ref_count(p) == 2;  // was referenced by the cache only
  }
  // Pages for the whole pending prompt plus the first decode token (capped by what it ever writes).
  const int64_t positions = std::min<int64_t>(int64_t(s.tokens.size()) + 1, s.max_positions());
  const int32_t need = pages_for_tokens(positions, cfg_.page_size) - matched;
  if (need > pool_.num_free() + evictable - lost - reserved) {
    pool_.release(s.pages);
    s.pages.clear();
    return false;
  }
  evictable -= lost;
  s.kv_len = matched * cfg_.page_size;
  s.indexed_pages = matched;
  if (s.cached_tokens < 0) s.cached_tokens = s.kv_len;
  totals_.cached_tokens += s.kv_len;
  return true;
}

void Scheduler::run_round(const EventSink& sink) {
  if (idle()) return;
  ++totals_.rounds;
  const int32_t page = cfg_.page_size;

  // 1. Admission (FIFO), within the running cap, this step's prefill budget and the pages.
  int32_t budget = cfg_.chunked_prefill_size, reserved = 0;
  auto plan_prefill = [&](const Sequence& s) {
    if (s.pending() <= 1) return;
    budget -= std::min(s.pending(), budget);
    reserved += std::max(0, pages_for_tokens(int64_t(s.tokens.size()), page) - int32_t(s.pages.size()));
  };
  for (const auto& s : running_) plan_prefill(*s);
  // After a retraction, admit again only once something finished (or nothing runs): the
  // pages are short, and admitting would retract again.
  const bool admit = !retracted_ || running_.empty();
  if (admit && !waiting_.empty() && int32_t(running_.size()) < cfg_.max_running && budget > 0) {
    int32_t evictable = cfg_.radix_cache ? cache_.num_evictable() : 0;
    while (!waiting_.empty() && int32_t(running_.size()) < cfg_.max_running && budget > 0) {
      if (!try_admit(*waiting_.front(), evictable, reserved)) break;
      plan_prefill(*waiting_.front());
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
  }
  if (running_.empty()) return;

  // 2. K decode steps when every running request is decoding and each has pages for them.
  int32_t steps = 1;
  const bool all_decode =
      std::all_of(running_.begin(), running_.end(), [](const SeqPtr& s) { return s->pending() == 1; });
  // A constrained request's mask depends on the token sampled just before: batches holding one
  // run one plain step per round (exact), whatever --num-continuous-decode-steps says, except
  // for speculative rounds on a backend that masks them itself (speculates_constrained: each
  // draft and verify row by the grammar's state after the tokens before it; the round gets the
  // matchers, SampleSpec::grammar, and fills no mask here).
  // A request dumping rows (RequestSpec::dump) gets them from step() only: one step per round too.
  const BackendInfo info = backend_.info();
  const bool dumping = std::any_of(running_.begin(), running_.end(), [](const SeqPtr& s) { return s->step_dump() != 0; });
  const bool constrained =
      std::any_of(running_.begin(), running_.end(), [](const SeqPtr& s) { return s->matcher.has_value(); });
  // Above --speculative-disable-by-batch-size running requests, a decode round is one plain step:
  // step() queues the pairs it completed for the MTP layer, as after a prefill (they run before the
  // next round: the MTP KV and the next draft source stay what rounds would have left; decode()
  // would speculate).
  const bool too_many = cfg_.speculative_disable_by_batch_size > 0 &&
                        int32_t(running_.size()) > cfg_.speculative_disable_by_batch_size;
  const bool can_speculate = cfg_.speculative_tokens > 0 && !dumping && (!constrained || info.speculates_constrained);
  const bool speculative = can_speculate && !too_many;
  if (can_speculate && too_many && all_decode) ++totals_.spec_disabled_rounds;  // rounds the flag made plain
  if (all_decode && (speculative || (cfg_.decode_steps > 1 && !dumping && !constrained))) {
    steps = speculative ? cfg_.speculative_tokens : cfg_.decode_steps;
    for (auto& s : running_)
      if (!ensure_pages(*s, s->kv_len + std::min(steps, s->remaining()))) {
        steps = 1;
        break;
      }
  }

  // 3. Pages for one step: decode tokens first, oldest first; retract the newest when none is left.
  if (steps == 1) {
    for (size_t i = 0; i < running_.size();) {
      Sequence& s = *running_[i];
      if (s.pending() != 1 || ensure_pages(s, s.kv_len + 1)) {
        ++i;
        continue;
      }
      retract(running_.size() - 1);  // the newest; when that was s, the loop ends
    }
  }
  std::vector<int32_t> take(running_.size(), 0);  // tokens each request computes this step
  budget = cfg_.chunked_prefill_size;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (s.pending() == 1) {
      take[i] = 1;
      continue;
    }
    int32_t t = std::min(s.pending(), budget);
    if (t <= 0) continue;
    if (!ensure_pages(s, int64_t(s.kv_len) + t)) {  // the cache is evicted: take what the free pages hold
      const int64_t room = (int64_t(s.pages.size()) + pool_.num_free()) * page - s.kv_len;
      t = int32_t(std::min<int64_t>(t, room));
      if (t <= 0 || !ensure_pages(s, int64_t(s.kv_len) + t)) continue;
    }
    take[i] = t;
    budget -= t;
  }
  if (std::all_of(take.begin(), take.end(), [](int32_t t) { return t == 0; })) {
    // Only prefills that found no page: make room by retracting the newest, or give up on a lone one.
    if (running_.size() > 1) {
      retract(running_.size() - 1);
    } else {
      Sequence& s = *running_[0];
      s.done = true;
      s.reason = FinishReason::kAbort;
      OutputEvent ev;
      ev.finished = true;
      ev.reason = FinishReason::kAbort;
      ev.abort_message = "the KV pool cannot hold this request";
      log_warn("scheduler: request {} aborted: {}", s.id, ev.abort_message);
      ev.usage = {s.prompt_len, std::max(0, s.cached_tokens), s.generated(), s.verify_steps};
      release(s);
      ++totals_.aborted;
      sink(s.id, std::move(ev));
      running_.clear();
    }
    return;
  }

  // 4. The batch and the backend call. The grammar masks of the requests that sample this step
  // are filled on the pool's threads when there are several (each request's matcher is its own;
  // the compiled grammars are shared read-only; B x ~45 µs on one thread otherwise): during the
  // backend's forward when it can wait for them before sampling (overlaps_token_masks), before
  // the step otherwise. Only the matchers' own state is read, so the tokens are the same.
  // A speculative round fills none: the backend masks its rows from the matchers on the engine
  // thread, inside decode(), and no fill job runs then (the last one was joined before the
  // round that started it ended), so a matcher is never touched by two threads at once.
  std::vector<Sequence*> fill;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (steps == 1 && take[i] > 0 && s.matcher && s.kv_len + take[i] == int32_t(s.tokens.size())) fill.push_back(&s);
  }
  auto fill_masks = [fill] {
    const int threads = fill.size() >= 4 ? std::min(default_num_threads(), int(fill.size())) : 1;
    parallel_for(int64_t(fill.size()), threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        Sequence& s = *fill[size_t(k)];
        s.matcher->fill_mask(s.mask);
        s.mask_empty = std::all_of(s.mask.begin(), s.mask.end(), [](uint32_t w) { return w == 0; });
        if (s.mask_empty) std::fill(s.mask.begin(), s.mask.end(), ~0u);  // sampled, then dropped
      }
    });
  };
  const bool overlap = !fill.empty() && cfg_.overlap_token_masks && info.overlaps_token_masks;
  if (!fill.empty() && !overlap) fill_masks();
  batch_.clear();
  std::vector<size_t> rows;
  for (size_t i = 0; i < running_.size(); ++i) {
    if (take[i] == 0) continue;
    Sequence& s = *running_[i];
    const bool samples = s.kv_len + take[i] == int32_t(s.tokens.size());
    SampleSpec spec = sample_spec(s);
    if (samples && s.matcher && steps > 1) spec.grammar = &*s.matcher;  // a speculative round masks its rows
    else if (samples && s.matcher) spec.allowed_tokens = s.mask.data();  // filled above, or during the forward
    batch_.add(s.id, {s.tokens.data() + s.kv_len, size_t(take[i])}, s.kv_len, s.pages, samples, spec);
    if ((batch_.dump.back() = s.step_dump()) != 0) batch_.dumps = &step_dumps_;
    rows.push_back(i);
  }
  step_dumps_.clear();
  // The fill runs from here until the backend waits for it; whatever happens in the backend,
  // it has finished before anything here reads a matcher or a mask again.
  struct JoinFill {
    MaskFiller* filler = nullptr;
    void finish() {  // quietly: the step failed anyway, and its own error is the one reported
      if (!filler) return;
      try {
        filler->wait();
      } catch (...) {
      }
      filler = nullptr;
    }
    ~JoinFill() { finish(); }
  } join_fill;
  if (overlap) {
    if (!mask_filler_) mask_filler_ = std::make_unique<MaskFiller>();
    mask_filler_->start(fill_masks);
    join_fill.filler = mask_filler_.get();
    batch_.await_token_masks = [f = mask_filler_.get()] { f->wait(); };
  }
  auto consume = [&](Sequence& s, int32_t written, std::vector<GeneratedToken>& produced) {
    const int32_t old_kv = s.kv_len;
    if (s.mask_empty) {  // its grammar allowed no token: the one sampled from the full mask goes
      s.mask_empty = false;
      produced.clear();
      s.done = true;
      s.reason = FinishReason::kAbort;
      s.abort_message = fmt::format("the grammar allows no next token (output index {})", s.generated());
    }
    for (size_t k = 0; k < produced.size(); ++k) {
      GeneratedToken& tok = produced[k];
      if (s.done) break;
      s.tokens.push_back(tok.id);
      const int32_t id = tok.id;
      s.fresh.push_back(std::move(tok));
      ++totals_.decode_tokens;
      if (s.matcher && !s.matcher->accept(id)) {
        s.done = true;
        s.reason = FinishReason::kAbort;
        s.abort_message = fmt::format("the sampled token {} is not one the grammar allows (output index {}, {} of the "
                                      "step's {} token(s), {})",
                                      id, s.generated() - 1, k + 1, produced.size(),
                                      steps > 1 ? (speculative ? "a speculative round" : "a multi-step decode")
                                                : "a one-token step");
      } else if (is_stop(s, id)) {
        s.done = true;
        s.reason = FinishReason::kStop;
        s.matched_stop = id;
      } else if (s.matcher && s.matcher->terminated()) {  // EOS with ignore_eos, or a vocabulary without EOS
        s.done = true;
        s.reason = FinishReason::kStop;
        s.matched_stop = std::find(cfg_.eos_ids.begin(), cfg_.eos_ids.end(), id) != cfg_.eos_ids.end() ? id : -1;
      } else if (s.remaining() <= 0 || int32_t(s.tokens.size()) >= cfg_.context_length) {
        s.done = true;
        s.reason = FinishReason::kLength;
      }
    }
    s.kv_len = std::min<int32_t>(old_kv + written, int32_t(s.tokens.size()));
  };
  // A StepError: the step did not happen for anyone. The requests it names (the whole batch
  // when it names none) are aborted and their pages freed; the others keep their KV length and
  // run again next round. Any other exception goes up and fails the engine.
  auto abort_failed = [&](const StepError& e) {
    const std::vector<uint64_t> ids = e.request_ids.empty() ? batch_.request_ids : e.request_ids;
    int32_t n = 0;
    for (uint64_t id : ids) n += cancel(id, std::string("the request failed: ") + e.what(), sink);
    log_warn("scheduler: a step failed for {} request(s), aborted; serving goes on: {}", n, e.what());
  };
  if (steps > 1) {
    DecodeLimits limits;
    for (size_t i : rows) {
      const Sequence& s = *running_[i];
      limits.max_new.push_back(std::min(steps, s.remaining()));
      std::vector<int32_t> stops = s.spec.stop_ids;
      if (!s.spec.ignore_eos) stops.insert(stops.end(), cfg_.eos_ids.begin(), cfg_.eos_ids.end());
      limits.stop_ids.push_back(std::move(stops));
    }
    DecodeOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      backend_.decode(batch_, limits, steps, out);
    } catch (const StepError& e) {
      abort_failed(e);
      return;
    }
    totals_.backend_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    FP4MOE_CHECK(out.tokens.size() == rows.size(), "backend decode returned {} rows for {}", out.tokens.size(), rows.size());
    int32_t longest = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
      auto& produced = out.tokens[k];
      FP4MOE_CHECK(!produced.empty() && int32_t(produced.size()) <= limits.max_new[k],
                   "backend decode produced {} tokens for a limit of {}", produced.size(), limits.max_new[k]);
      longest = std::max(longest, int32_t(produced.size()));
      consume(*running_[rows[k]], int32_t(produced.size()), produced);
    }
    if (speculative) {  // one verify step (the draft steps are the backend's)
      ++totals_.steps;
      ++totals_.verify_steps;
      int32_t emitted = 0;
      for (size_t k = 0; k < rows.size(); ++k) {
        emitted += int32_t(out.tokens[k].size());
        ++running_[rows[k]]->verify_steps;
      }
      if (StepObserver* o = backend_.observer()) o->on_step(int32_t(rows.size()), emitted);
    } else {
      totals_.steps += longest;
    }
    if (StepObserver* o = backend_.observer(); o && !speculative)
      for (int32_t j = 0; j < longest; ++j) {
        int32_t active = 0;
        for (const auto& produced : out.tokens) active += int32_t(produced.size()) > j;
        o->on_step(active, active);
      }
  } else {
    std::vector<GeneratedToken> sampled;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      backend_.step(batch_, sampled);
      if (overlap) mask_filler_->wait();  // a backend that sampled nothing constrained may not have waited
    } catch (const StepError& e) {
      join_fill.finish();  // before the aborts free the sequences the fill writes to
      abort_failed(e);
      return;
    }
    for (RowDump& d : step_dumps_) {
      FP4MOE_CHECK(d.request >= 0 && size_t(d.request) < rows.size(), "backend dump for request {} of {}", d.request,
                   rows.size());
      running_[rows[size_t(d.request)]]->dumps.push_back(std::move(d));
    }
    step_dumps_.clear();
    totals_.backend_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (StepObserver* o = backend_.observer()) o->on_step(batch_.num_requests(), batch_.num_tokens());
    size_t next = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
      Sequence& s = *running_[rows[k]];
      const int32_t n = batch_.count(int32_t(k));
      if (!batch_.sample[k]) {
        s.kv_len += n;
        totals_.prefill_tokens += n;
        continue;
      }
      FP4MOE_CHECK(next < sampled.size(), "backend step returned {} tokens, fewer than the batch samples", sampled.size());
      if (n > 1 || s.generated() == 0) totals_.prefill_tokens += n;
      std::vector<GeneratedToken> one;
      one.push_back(std::move(sampled[next++]));
      consume(s, n, one);
    }
    FP4MOE_CHECK(next == sampled.size(), "backend step returned {} tokens for {} sampling requests", sampled.size(), next);
    ++totals_.steps;
  }

  // 5. Index finished prompts, emit, free what finished. The backend hears of every request that
  // finished this round in one call (a speculating backend runs their waiting MTP pairs batched:
  // on the GPU one launch-bound MTP step per call, not per request).
  std::vector<uint64_t> leaving;
  for (const SeqPtr& s : running_)
    if (s->done && !s->pages.empty()) leaving.push_back(s->id);
  if (!leaving.empty()) backend_.release_requests(leaving);
  size_t keep = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (!s.done && s.kv_len >= s.prompt_len && s.indexed_pages < s.prompt_len / page) cache_prefix(s);  // once per prompt
    if (!s.fresh.empty() || !s.dumps.empty() || s.done) {
      OutputEvent ev;
      ev.tokens = std::move(s.fresh);
      s.fresh.clear();
      ev.dumps = std::move(s.dumps);
      s.dumps.clear();
      if (s.done) {
        ev.finished = true;
        ev.reason = s.reason;
        ev.matched_stop_id = s.matched_stop;
        ev.abort_message = s.abort_message;
        if (s.reason == FinishReason::kAbort) log_warn("scheduler: request {} aborted: {}", s.id, s.abort_message);
        ev.usage = {s.prompt_len, std::max(0, s.cached_tokens), s.generated(), s.verify_steps};
        release(s, /*backend_told=*/true);
        ++totals_.finished;
        retracted_ = false;
      }
      sink(s.id, std::move(ev));
    }
    if (!s.done) running_[keep++] = std::move(running_[i]);
  }
  running_.resize(keep);
}

bool Scheduler::cancel(uint64_t id, const std::string& why, const EventSink& sink) {
  auto abort_event = [&](Sequence& s) {
    log_warn("scheduler: request {} aborted: {}", s.id, why);
    OutputEvent ev;
    ev.finished = true;
    ev.reason = FinishReason::kAbort;
    ev.abort_message = why;
    ev.usage = {s.prompt_len, std::max(0, s.cached_tokens), s.generated(), s.verify_steps};
    ++totals_.aborted;
    sink(s.id, std::move(ev));
  };
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      SeqPtr s = std::move(*it);
      waiting_.erase(it);
      abort_event(*s);
      return true;
    }
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if ((*it)->id == id) {
      SeqPtr s = std::move(*it);
      running_.erase(it);
      release(*s);
      abort_event(*s);
      retracted_ = false;
      return true;
    }
  return false;
}

void Scheduler::cancel_all(const std::string& why, const EventSink& sink) {
  std::vector<uint64_t> ids;
  for (const auto& s : running_) ids.push_back(s->id);
  for (const auto& s : waiting_) ids.push_back(s->id);
  for (uint64_t id : ids) cancel(id, why, sink);
}

int32_t Scheduler::flush_cache() { return cfg_.radix_cache ? cache_.evict_all() : 0; }

SchedulerStats Scheduler::stats() const {
  SchedulerStats st = totals_;
  st.running = int32_t(running_.size());
  st.waiting = int32_t(waiting_.size());
  st.pages_free = pool_.num_free();
  st.pages_cached = cfg_.radix_cache ? cache_.num_evictable() : 0;
  st.pages_used = st.pages_total - st.pages_free - st.pages_cached;
  st.tokens_in_use = 0;
  for (const auto& s : running_) st.tokens_in_use += s->kv_len;
  return st;
}

void Scheduler::check_invariants() const {
  std::vector<int32_t> refs(size_t(cfg_.num_pages), 0);
  for (const auto& s : running_) {
    FP4MOE_CHECK(int64_t(s->pages.size()) >= pages_for_tokens(s->kv_len, cfg_.page_size),
                 "request {}: {} pages for {} KV tokens", s->id, s->pages.size(), s->kv_len);
    for (int32_t p : s->pages) ++refs[size_t(p)];
  }
  for (const auto& s : waiting_) FP4MOE_CHECK(s->pages.empty(), "waiting request {} holds pages", s->id);
  cache_.for_each_page([&](int32_t p) { ++refs[size_t(p)]; });
  int32_t free = 0;
  for (int32_t p = 0; p < cfg_.num_pages; ++p) {
    FP4MOE_CHECK(pool_.ref_count(p) == refs[size_t(p)], "page {}: {} references, {} holders", p, pool_.ref_count(p),
                 refs[size_t(p)]);
    free += refs[size_t(p)] == 0;
  }
  FP4MOE_CHECK(free == pool_.num_free(), "{} pages unreferenced, {} on the free list", free, pool_.num_free());
  int32_t indexed = 0;
  for (int32_t p = 0; p < cfg_.num_pages; ++p) indexed += pool_.indexed(p);
  FP4MOE_CHECK(indexed == cache_.num_nodes(), "{} pages marked indexed, {} cache nodes", indexed, cache_.num_nodes());
  if (cfg_.radix_cache) {
    FP4MOE_CHECK(cache_.num_evictable() == cache_.count_evictable_by_walk(), "{} evictable pages counted, {} in the tree",
                 cache_.num_evictable(), cache_.count_evictable_by_walk());
    FP4MOE_CHECK(cache_.num_evictable_leaves() == cache_.count_evictable_leaves_by_walk(),
                 "{} evictable leaves kept, {} in the tree", cache_.num_evictable_leaves(),
                 cache_.count_evictable_leaves_by_walk());
  }
}

}  // namespace fp4moe::engine
