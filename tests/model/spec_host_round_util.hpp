// Test support for the host speculative round (spec_host_round_test): steps whose logits are rows
// of a fixed random bank (no model: a round costs only its host work and a memcpy per row), a
// cheap grammar-like constraint, and a driver that runs rounds over a batch of requests the way
// the engine does (positions, generated tokens, output indices and the constraint advanced over
// what each round emitted; a request ends at a stop id, at its token budget or when its
// constraint's text ends).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/threads.hpp"
#include "model/speculative.hpp"

namespace fp4moe::testing_spec {

// The logits row of (request, predicted position) is bank row hash(first page, position): the
// MTP layer at position j predicts the token at j + 2, the verify row at j the token at j + 1, so
// with `agree` both give the same row for a position (p = q: every draft is accepted, the most
// host work a round can have); without, the verify rows are other bank rows.
class BankSpecSteps final : public model::SpecSteps {
 public:
  // lend: the steps keep the logits in a buffer of their own and lend it (SpecSteps::lends_logits,
  // the GPU runner's form) instead of writing the caller's storage.
  BankSpecSteps(int64_t vocab, int64_t hidden, bool agree, bool rows_form, int64_t bank_rows, bool lend = false,
                uint32_t seed = 7)
      : agree_(agree), rows_form_(rows_form), lend_(lend), bank_rows_(bank_rows) {
    cfg_.vocab = vocab;
    cfg_.hidden = hidden;
    bank_.resize(size_t(bank_rows * vocab));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 2.5f);
    for (float& v : bank_) v = nd(rng);
  }
  const model::MlaModelConfig& config() const override { return cfg_; }
  int64_t page_size() const override { return 64; }
  void verify(const TensorView& tokens, const KvBatchView& b, const std::vector<int32_t>& rows, const TensorView& logits,
              float* hidden) override {
    fill(b, rows, out(logits, rows.size()), /*ahead=*/1, agree_ ? 0 : 17);
    const auto t0 = std::chrono::steady_clock::now();
    std::memset(hidden, 0, size_t(tokens.size(0) * cfg_.hidden) * 4);
    fill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void mtp(const TensorView& tokens, const float*, const KvBatchView& b, const std::vector<int32_t>& rows,
           const TensorView& logits, float* h_out) override {
    fill(b, rows, out(logits, rows.size()), 2, 0);
    const auto t0 = std::chrono::steady_clock::now();
    if (h_out) std::memset(h_out, 0, size_t(tokens.size(0) * cfg_.hidden) * 4);
    fill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  bool offers_catchup_over_verify_rows() const override { return rows_form_; }
  bool catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                const TensorView& logits, float* h_out) override {
    if (!rows_form_) return false;
    std::vector<int32_t> rows(size_t(b.num_tokens));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(i);
    mtp(tokens, h_in, b, rows, logits, h_out);
    return true;
  }
  bool lends_logits() const override { return lend_; }
  const float* last_logits() const override { return lend_ ? own_.data() : nullptr; }
  // Rewrites the bank (tests of special values): fn(data, size).
  template <class Fn>
  void edit_bank(Fn fn) { fn(bank_.data(), int64_t(bank_.size())); }
  double fill_seconds = 0.0;  // the steps' own time (the memcpy of bank rows)

 private:
  float* out(const TensorView& logits, size_t rows) {
    if (logits.data) return logits.ptr<float>();
    if (own_.size() < rows * size_t(cfg_.vocab)) own_.resize(rows * size_t(cfg_.vocab));
    if (own_.size() <= (size_t(1) << 22)) std::fill(own_.begin(), own_.end(), std::nanf(""));  // a stale row read by mistake shows (tests' sizes)
    return own_.data();
  }
  void fill(const KvBatchView& b, const std::vector<int32_t>& rows, float* out, int32_t ahead, int64_t salt) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t V = cfg_.vocab;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t t = rows[i];
      int64_t r = 0;
      while (b.qo_indptr[r + 1] <= t) ++r;
      const int64_t ident = b.page_indices[b.page_indptr[r]];
      const int64_t pos = b.positions[t] + ahead;
      const int64_t row = (ident * 7919 + pos * 31 + salt) % bank_rows_;
      std::memcpy(out + int64_t(i) * V, bank_.data() + row * V, size_t(V) * 4);
    }
    fill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  model::MlaModelConfig cfg_;
  bool agree_, rows_form_, lend_;
  std::vector<float> own_;
  int64_t bank_rows_;
  std::vector<float> bank_;
};

// Allows token v when (v + s) % 3 != 0, s: the sum of the accepted tokens mod 3; the text ends
// after a token divisible by `end_every` (then nothing is allowed). Words filled word by word.
class ModThreeConstraint final : public model::TokenConstraint {
 public:
  ModThreeConstraint(int64_t vocab, int32_t end_every) : vocab_(vocab), end_every_(end_every) {}
  void fill_mask(std::span<uint32_t> mask) override {
    if (terminated()) {
      std::fill(mask.begin(), mask.end(), 0u);
      return;
    }
    const int32_t s = state();
    uint32_t pat[3] = {0, 0, 0};
    for (int32_t v = 0; v < 96; ++v)
      if ((v + s) % 3 != 0) pat[v / 32] |= 1u << (v % 32);
    for (size_t w = 0; w < mask.size(); ++w) mask[w] = pat[w % 3];
    if (vocab_ % 32) mask[size_t(vocab_ / 32)] &= (1u << (vocab_ % 32)) - 1u;
  }
  bool accept(int32_t t) override {
    if (terminated() || (t + state()) % 3 == 0) return false;
    hist_.push_back(t);
    return true;
  }
  bool terminated() const override { return !hist_.empty() && hist_.back() % end_every_ == 0; }
  void rollback(int32_t n) override { hist_.resize(hist_.size() - size_t(n)); }

 private:
  int32_t state() const {
    int64_t s = 0;
    for (int32_t t : hist_) s += t;
    return int32_t(s % 3);
  }
  int64_t vocab_;
  int32_t end_every_;
  std::vector<int32_t> hist_;
};

enum class Mode {
  kGreedy,                    // temperature 0
  kSampled,                   // temperature 0.7, top-p 0.9, top-k 50
  kSampledConstrained,        // and a ModThreeConstraint
  kSampledPenaltiesLogprobs,  // and repetition / presence / frequency penalties, logprobs top 3
  kGreedyPenaltiesLogprobs,   // greedy with a repetition penalty, logprobs top 2
  kSampledFullVocab,          // temperature 1, no truncation (min-p 0.01 on every other)
};

class RoundDriver {
 public:
  RoundDriver(model::SpecSteps& steps, int32_t num_steps, int threads)
      : steps_(steps), spec_(steps, num_steps), n_(num_steps) {
    spec_.threads = threads;
  }
  model::MtpSpeculator& spec() { return spec_; }
  int32_t constraint_end_every = 61;  // ModThreeConstraint's of the requests added after
  int32_t pages_per_request = 64;     // request i holds pages i * this .. (i + 1) * this - 1
  void add(Mode m, int64_t max_tokens) {
    auto q = std::make_unique<Req>();
    const int32_t i = int32_t(reqs_.size());
    const int64_t V = steps_.config().vocab;
    q->rq.id = uint64_t(100 + i);
    q->rq.start = 0;
    q->rq.last_token = int32_t((11 + 13 * i) % V);
    q->prompt = {q->rq.last_token, int32_t((5 + i) % V), int32_t((9 + 2 * i) % V)};
    q->rq.prompt = q->prompt;
    q->pages.resize(size_t(pages_per_request));
    for (size_t p = 0; p < q->pages.size(); ++p) q->pages[p] = i * pages_per_request + int32_t(p);
    q->rq.pages = q->pages;
    q->stops = {7, 8, 9};
    q->rq.stop_ids = q->stops;
    cpu::SamplingParams& s = q->rq.sampling;
    s.seed = 4242 + uint64_t(i), s.has_seed = true;
    s.temperature = 0.7f, s.top_p = 0.9f, s.top_k = 50;
    switch (m) {
      case Mode::kGreedy: s.temperature = 0.0f; break;
      case Mode::kSampled: break;
      case Mode::kSampledConstrained:
        q->constraint = std::make_unique<ModThreeConstraint>(V, constraint_end_every);
        q->rq.constraint = q->constraint.get();
        break;
      case Mode::kSampledPenaltiesLogprobs:
        s.repetition_penalty = 1.1f, s.presence_penalty = 0.2f, s.frequency_penalty = 0.1f, s.logprobs_top_n = 3;
        break;
      case Mode::kGreedyPenaltiesLogprobs:
        s.temperature = 0.0f, s.repetition_penalty = 1.2f, s.logprobs_top_n = 2;
        break;
      case Mode::kSampledFullVocab:
        s.temperature = 1.0f, s.top_p = 1.0f, s.top_k = -1, s.min_p = i % 2 ? 0.01f : 0.0f;
        break;
    }
    q->max_tokens = max_tokens;
    reqs_.push_back(std::move(q));
  }
  // One round over the requests still running; their results in order.
  std::vector<model::SpecRoundResult> round() {
    std::vector<model::SpecRequest> batch;
    std::vector<Req*> who;
    for (auto& q : reqs_) {
      if (q->done) continue;
      q->rq.max_new = int32_t(std::min<int64_t>(n_ + 1, q->max_tokens - q->produced));
      batch.push_back(q->rq);
      who.push_back(q.get());
    }
    std::vector<model::SpecRoundResult> res = spec_.round(batch);
    for (size_t r = 0; r < res.size(); ++r) {
      Req& q = *who[r];
      bool end = false;
      for (const cpu::SampledToken& t : res[r].tokens) {
        q.rq.generated.push_back(t.token);
        if (q.constraint) end = !q.constraint->accept(t.token) || q.constraint->terminated() || end;
        end = end || std::find(q.stops.begin(), q.stops.end(), t.token) != q.stops.end();
      }
      const int32_t m = int32_t(res[r].tokens.size());
      q.produced += m;
      q.rq.start += m;
      q.rq.output_index += uint64_t(m);
      q.rq.last_token = res[r].tokens.back().token;
      if (end || q.produced >= q.max_tokens || q.rq.start + n_ + 2 > int64_t(q.pages.size()) * steps_.page_size()) {
        q.done = true;
        spec_.forget(q.rq.id);
      }
    }
    return res;
  }

 private:
  struct Req {
    model::SpecRequest rq;
    std::vector<int32_t> prompt, pages, stops;
    std::unique_ptr<ModThreeConstraint> constraint;
    int64_t max_tokens = 0, produced = 0;
    bool done = false;
  };
  model::SpecSteps& steps_;
  model::MtpSpeculator spec_;
  int32_t n_;
  std::vector<std::unique_ptr<Req>> reqs_;
};

}  // namespace fp4moe::testing_spec
