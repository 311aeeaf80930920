// Speculative decoding with the model's MTP layer on the CPU backend (SGLang's NEXTN / EAGLE
// chain, top-k 1): per request, the MTP layer chained N times proposes N draft tokens; one
// batched target step verifies the N + 1 positions; the longest matching prefix plus one
// bonus token is accepted.
//
// The state of a request between rounds: the MTP layer has run over every pair
// (h_j, t_{j+1}) up to the request's last computed position j = start − 1 (h_j: the target's
// hidden state after the final norm), so its KV (pool layer num_layers) holds those positions
// and its logits / hidden state at start − 1 give the first draft. A round:
//   1. drafts d_1 .. d_n (n = min(N, max_new − 1)): d_1 from the stored MTP logits; d_k from
//      the MTP layer at position start + k − 2 with token d_{k−1} and the MTP layer's own
//      hidden state of the previous draft step (its KV rows there are overwritten later).
//   2. verify: the target over [t_start, d_1 .. d_n] at positions start .. start + n, in the
//      weight-absorbed attention form, so that every row equals a one-token decode step bit
//      for bit (the KV rows of accepted positions are those of the plain run).
//   3. accept: greedy — d_k while it equals the target's choice at row k−1 (the same draw
//      sample_cpu makes, penalties included), then the target's own choice (the bonus);
//      sampled — rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept d_k with
//      probability min(1, p(d_k) / q(d_k)) (p, q: the target's and the draft's distributions
//      after the request's penalties, temperature, top-k / top-p / min-p), else draw from
//      norm(max(0, p − q)) and stop; after n accepts the bonus is drawn from p. The output is
//      distributed as the target's. Draws are fixed by (seed, output index) in three streams
//      (draft, accept, residual); the bonus uses the plain sampler's stream.
//   4. the emitted tokens end at the first stop id or at max_new; then the MTP layer runs over
//      the emitted pairs (h from the verify rows), which rewrites its KV at start .. start +
//      m − 1 with the exact values and gives the next round's first draft.
// Target KV rows of rejected positions lie beyond the request's length: never read, and
// overwritten by the next step (the roll-back is the length).
// The host round's per-request work (draws, acceptance, masks, traces, the MTP state copied out)
// runs on core/threads.hpp's pool (MtpSpeculator::threads), with the same results for any thread
// count (speculative_host_round.cpp); sampled rows use sparse distributions (the kept set).
// The round runs on the host over a backend's two steps (SpecSteps): the CPU model's
// (ModelSpecSteps, below) or the GPU runner's (backend/cuda/gpu_spec_steps.hpp); the draws and
// acceptance are this file's on every backend.
// Constrained requests (SpecRequest::constraint, a grammar): every row of the round is masked
// by the grammar's state after the tokens before it — the MTP row that drafts d_k by the state
// after d_1 .. d_{k−1}, verify row k by the state after d_1 .. d_k (which is the accepted
// prefix wherever row k is read) — so q and p above are the masked distributions. Greedy: each
// emitted token is the argmax of its masked target row, the plain constrained step's token.
// Sampled: the mask of position k is a function of the tokens emitted before it, the same on
// both paths, and rejection sampling of the masked p against the masked q emits a token
// distributed as the masked p (the theorem holds for any pair of distributions; p(d) = 0 for a
// token outside the mask, so such a draft is always rejected and the residual max(0, p − q)
// lies inside the mask): the output is distributed as the plain constrained sampler's
// (lossless). A draft the grammar refuses (only draft_override's can be: the MTP's own come from
// masked rows) ends the chain before it; a draft after which the text has ended (a stop id)
// ends the chain, and an accepted one the round, there.
#pragma once

#include <chrono>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/sampling_cpu.hpp"
#include "model/model.hpp"

namespace fp4moe::model {

// Constrained decoding (a grammar; the engine's matcher behind it): the tokens a request may
// emit next. A round masks the request's draft and verify rows with the state after the tokens
// before them, ends its draft chain at a draft the grammar refuses (or after one that ends the
// text), and leaves the constraint in the state it found it in (the caller advances it over
// the emitted tokens). The host round calls different requests' constraints from different
// threads at once (one constraint only ever from one thread at a time): each must own its state
// (the engine's grammar matchers do; their compiled grammar is shared read-only).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual void fill_mask(std::span<uint32_t> mask) = 0;  // bit v % 32 of word v / 32 set = token v allowed
  virtual bool accept(int32_t token) = 0;                 // advances; false (unchanged) when not allowed
  virtual bool terminated() const = 0;                    // a stop id ended the text: nothing may follow
  virtual void rollback(int32_t n) = 0;                   // undoes the last n accepts
};

// One request of a draft/verify round.
struct SpecRequest {
  uint64_t id = 0;
  int32_t start = 0;                  // position of last_token (the request's KV length before the round)
  int32_t last_token = 0;
  std::span<const int32_t> pages;     // covers start + min(N, max_new − 1) + 1 positions
  int32_t max_new = 1;                // tokens the round may emit at most (>= 1)
  std::span<const int32_t> stop_ids;  // the round ends after emitting one of them
  cpu::SamplingParams sampling;
  std::span<const int32_t> prompt;
  std::vector<int32_t> generated;     // tokens generated before the round (penalties)
  uint64_t output_index = 0;          // index of the round's first emitted token (the draws)
  TokenConstraint* constraint = nullptr;  // null: unconstrained
};

struct SpecRoundResult {
  std::vector<cpu::SampledToken> tokens;  // 1 .. n + 1 emitted
  int32_t drafted = 0;                    // n
  int32_t accepted = 0;                   // drafts accepted (emitted = accepted + 1, unless a stop / max_new cut it)
};

// Tests: replaces the MTP's draft choice (request id, the output index the draft proposes a token
// for, the MTP's own choice);
// returns the token to propose (drafts from a precomputed run exercise the accept paths that a
// random-weight model rarely reaches). The draft distribution q stays the MTP's.
using DraftOverride = std::function<int32_t(uint64_t id, uint64_t output_index, int32_t mtp_choice)>;

// One request's host round as it ran (MtpSpeculator::on_round; a constrained round that emits a
// token outside its row's mask logs it at warn level): the drafts the grammar accepted, what was
// emitted, and per emitted position k (verify row k) what its mask allowed and what the target's
// logits held there.
struct RoundTrace {
  uint64_t id = 0;
  uint64_t output_index = 0;  // of the first emitted token
  int32_t start = 0;
  bool constrained = false, sampled = false, rows_form = false;  // rows_form: the catch-up over every verify row
  std::vector<int32_t> drafts;   // n
  int32_t accepted = 0;
  int32_t ended_at = -1;         // drafts after which the grammar's text ended (-1: none)
  std::vector<int32_t> emitted;
  // Per emitted position (constrained requests): tokens its mask allows (-1: the row was not
  // masked), whether the emitted token is one of them, how many of them have a non-finite logit,
  // the largest of their logits.
  std::vector<int32_t> allowed;
  std::vector<bool> inside;
  std::vector<int32_t> nonfinite;
  std::vector<float> best_logit;
  bool emitted_outside_mask() const { return std::find(inside.begin(), inside.end(), false) != inside.end(); }
  std::string describe() const;  // one line
};

// Draws from an unnormalised distribution: the first i whose cumulative mass exceeds u · total.
int32_t draw_from(const std::vector<double>& dist, double u);
int32_t draw_from(const cpu::SparseDistribution& dist, double u);  // the same token as the dense form's

// One sampled verification position: the draft d was drawn from q; p is the target's
// distribution. Accepts d with probability min(1, p(d) / q(d)) (u_accept < p(d) / q(d)), else
// draws from norm(max(0, p − q)) with u_residual (from p when that is empty). The token
// emitted is distributed as p.
struct SampledVerdict {
  int32_t token = -1;
  bool accepted = false;
};
SampledVerdict verify_sampled(const std::vector<double>& p, const std::vector<double>& q, int32_t d, double u_accept,
                              double u_residual);
// The same verdict over sparse forms (the residual lies on p's listing: max(0, p − q) is +0.0 elsewhere).
SampledVerdict verify_sampled(const cpu::SparseDistribution& p, const cpu::SparseDistribution& q, int32_t d,
                              double u_accept, double u_residual);

// Which requests a greedy round on the device may take (SpecSteps::greedy_round): every draw is
// the argmax of the raw logits — greedy (temperature 0 or top_k 1), no repetition / presence /
// frequency penalty, no logprobs (logprobs_top_n -1), no grammar constraint. top_p / min_p / seed
// are then irrelevant (greedy ignores them).
bool device_round_eligible(const SpecRequest& r);

// A greedy round in one launch sequence (a backend's SpecSteps::greedy_round; the GPU runner's
// spec_round_greedy): R requests; request r at position start[r] with its last token, its MTP
// state first_draft[r] (the argmax of the MTP logits at start - 1) and draft_hidden row r (the
// MTP layer's output state there, FP32 [R, hidden]; read where num_drafts >= 2);
// num_drafts[r] = n <= min(max_drafts, max_new[r] - 1); pages[r] cover start + n + 1 positions.
struct GreedyRoundInput {
  int32_t max_drafts = 1;
  std::vector<int32_t> start, last_token, first_draft, num_drafts, max_new;
  std::vector<std::vector<int32_t>> pages, stop_ids;
  const float* draft_hidden = nullptr;
};
// tokens [R, max_drafts + 1] emitted (-1 after count[r]); accepted drafts; the MTP state after the
// catch-up over the emitted pairs: next_draft[r] (its argmax at start + count - 1) and
// next_hidden [R, hidden].
struct GreedyRoundOutput {
  std::vector<int32_t> tokens, count, accepted, next_draft;
  std::vector<float> next_hidden;
  double device_ms = 0.0;  // the backend's device time for the round (0: not measured)
};

// The two steps a round runs, over host arrays (tokens I32 [T], logits F32 [rows, vocab], hidden
// states FP32 [T, hidden]); the KV pool (with the MTP layer's as layer num_layers) is the backend's.
class SpecSteps {
 public:
  virtual ~SpecSteps() = default;
  virtual const MlaModelConfig& config() const = 0;
  virtual int64_t page_size() const = 0;
  // The target over the batch with every row as a one-token decode step would compute it (the
  // verify step): logits of `rows`, every token's hidden state after the final norm.
  virtual void verify(const TensorView& tokens, const KvBatchView& b, const std::vector<int32_t>& rows,
                      const TensorView& logits, float* hidden) = 0;
  // The MTP layer over the batch (Model::mtp_step's contract): h_in [T, hidden] in, h_out out.
  virtual void mtp(const TensorView& tokens, const float* h_in, const KvBatchView& b, const std::vector<int32_t>& rows,
                   const TensorView& logits, float* h_out) = 0;
  // A whole greedy round on the backend's device (GreedyRoundInput); false: this backend has none
  // (the round then runs on the host over verify / mtp). offers_greedy_round: whether it may
  // (MtpSpeculator builds the round's input only then).
  virtual bool offers_greedy_round() const { return false; }
  // The host round's MTP catch-up in the device round's form (a backend with greedy_round runs
  // both alike, so that host and device rounds give the same bits): the MTP layer over EVERY
  // verify row — b is the verify step's batch (request r's rows at start .. start + n), tokens[j]
  // the target's choice at row j (the emitted token where j < m), h_in the verify rows' states —
  // with every row's logits [T, vocab] and states [T, hidden]. Rows past a request's emitted ones
  // write MTP KV beyond its length (rewritten before anything reads it). false: not offered (the
  // speculator queues the emitted pairs for run_queued instead).
  virtual bool offers_catchup_over_verify_rows() const { return false; }
  virtual bool catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                        const TensorView& logits, float* h_out) {
    (void)tokens, (void)h_in, (void)b, (void)logits, (void)h_out;
    return false;
  }
  // A backend whose steps leave the logits in host memory of its own (the GPU runner's read-back
  // buffer) may lend them instead of copying: the host round then passes logits views without
  // data (TensorView{}) to verify / mtp / catchup_over_verify_rows and reads last_logits() — the
  // last call's [rows, vocab], valid until the next call. Other callers (run_queued) pass storage.
  virtual bool lends_logits() const { return false; }
  virtual const float* last_logits() const { return nullptr; }
  virtual bool greedy_round(const GreedyRoundInput& in, GreedyRoundOutput& out) {
    (void)in;
    (void)out;
    return false;
  }
};

// The CPU model's steps (Model::step with StepExtras::absorbed, Model::mtp_step) over a host pool.
class ModelSpecSteps final : public SpecSteps {
 public:
  // kv: the pool of the target steps, with the MTP layer as layer num_layers (mtp_kv_geometry).
  // catchup_over_verify_rows (tests): offer the GPU runner's catch-up form (the MTP layer over
  // every verify row, Model::mtp_step over the verify batch), so that the host round takes the
  // path the cuda backend takes.
  ModelSpecSteps(Model& model, HostKvPool& kv, bool catchup_over_verify_rows = false);
  const MlaModelConfig& config() const override { return model_.config(); }
  int64_t page_size() const override { return kv_.geometry().page_size; }
  void verify(const TensorView& tokens, const KvBatchView& b, const std::vector<int32_t>& rows, const TensorView& logits,
              float* hidden) override;
  void mtp(const TensorView& tokens, const float* h_in, const KvBatchView& b, const std::vector<int32_t>& rows,
           const TensorView& logits, float* h_out) override;
  bool offers_catchup_over_verify_rows() const override { return catchup_; }
  bool catchup_over_verify_rows(const TensorView& tokens, const float* h_in, const KvBatchView& b,
                                const TensorView& logits, float* h_out) override;

 private:
  Model& model_;
  HostKvPool& kv_;
  bool catchup_ = false;
};

// Seconds since t0 (the speculator's per-phase Times; speculative.cpp and speculative_host_round.cpp).
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class MtpSpeculator {
 public:
  // kv: the pool of the target steps, with the MTP layer as layer num_layers (mtp_kv_geometry).
  // catchup_over_verify_rows: ModelSpecSteps' (tests: the cuda backend's catch-up form).
  MtpSpeculator(Model& model, HostKvPool& kv, int32_t num_steps, bool catchup_over_verify_rows = false);
  // Any backend's steps (kept by reference).
  MtpSpeculator(SpecSteps& steps, int32_t num_steps);
  int32_t num_steps() const { return n_; }
  DraftOverride draft_override;  // tests only (forces the host round)
  // Threads of the host round's per-request work (the draws, acceptance, masks, catch-up copies;
  // core/threads.hpp's pool): 0: default_num_threads() capped at kMaxHostThreads (the Model
  // constructor: the model's own thread option). Every result is the same for any count.
  int threads = 0;
  static constexpr int kMaxHostThreads = 16;
  // Diagnostics and tests: called with each request's trace after every host round.
  std::function<void(const RoundTrace&)> on_round;
  // A batch whose requests are all device_round_eligible runs as one greedy round on the device
  // when the steps offer one (SpecSteps::greedy_round): the same tokens as the host round. Off:
  // always the host round (bench step times both).
  bool device_rounds = true;
  int64_t device_round_count = 0, host_round_count = 0;  // rounds run each way
  int64_t queued_mtp_steps = 0;                          // MTP steps over queued pairs (run_queued)
  // Wall seconds since construction: chained draft steps, verify steps, MTP steps over emitted / prompt pairs.
  struct Times {
    double draft = 0.0, verify = 0.0, mtp = 0.0;
    double device_round = 0.0;  // wall seconds of device rounds (drafts, verify, catch-up together)
    // The host round's own work (wall seconds; parts of the above where they overlap): the draft
    // choices (masks, draws; the first draft's before the chained steps), the acceptance over
    // the verify rows (draws, masks, logprobs, traces), the catch-up's host side (the argmax of
    // rows past the emitted ones, the MTP state copied out), the round's logits / hidden buffers.
    double host_draft = 0.0, host_accept = 0.0, host_catchup = 0.0, host_buffers = 0.0;
  } times;

  // After a target step that computed positions [p0, p0 + tokens.size()) of a request, with
  // `hidden` its rows after the final norm [n, hidden]: queues the MTP pairs (h_j, t_{j+1})
  // whose next token is known (next: the token sampled after the last position, or -1 for a
  // prefill chunk that does not sample; that row waits for the next chunk).
  // keep_logits: run_queued keeps the logits of every pair queued for the request (take_logits).
  void add_target_rows(uint64_t id, int32_t p0, std::span<const int32_t> tokens, const float* hidden, int32_t next,
                       std::span<const int32_t> pages, bool keep_logits = false);
  // The MTP logits kept by the last run_queued for a request queued with keep_logits: rows of
  // positions [*start, *start + rows) ([rows, vocab]; h at start + i, the token at start + i + 1);
  // empty when none.
  std::vector<float> take_logits(uint64_t id, int32_t* start);
  // One MTP step over every queued pair of every request (batched).
  void run_queued();
  // What a backend's target step calls after add_target_rows: the queued pairs may wait, so that
  // plain decode rounds (--speculative-disable-by-batch-size) do not pay one MTP step each — they
  // run here only when one of them keeps its logits or more than defer_rows pairs wait (0: never
  // wait; a backend sets it to the rows one of its steps takes). Every waiting pair runs before a
  // round (round()) and a request's own before it goes (release()), so the MTP layer's drafts and
  // its KV rows are the same bits as when each plain step ran them (CPU). Queued pairs run in MTP
  // steps of at most defer_rows pairs where requests can be split (a request's own pairs: one step).
  void settle_queued();
  int64_t defer_rows = 0;
  // Finished, aborted or retracted requests (those leaving in one scheduler round, together): their
  // waiting pairs run, batched into MTP steps of at most defer_rows pairs (the MTP KV rows of the
  // pages the prefix cache may keep are complete), then their state goes (forget). Never throws: a
  // failed MTP step is a warning (the requests are gone; only drafts over their cached pages would
  // read those rows).
  void release(std::span<const uint64_t> ids);
  // One draft/verify round over the requests; results in request order.
  std::vector<SpecRoundResult> round(const std::vector<SpecRequest>& requests);
  void forget(uint64_t id) {
    state_.erase(id);
    queue_.erase(id);
    kept_.erase(id);
  }

 private:
  struct State {
    int32_t mtp_pos = -1;               // last position the MTP layer ran at (the draft source)
    std::vector<float> draft_logits;    // [vocab] its logits there (empty after a device round)
    int32_t draft_token = -1;           // after a device round: the argmax of those logits
    std::vector<float> draft_hidden;    // [hidden] its output hidden state there
    int32_t pending_pos = -1;           // a target row whose next token is not known yet
    std::vector<float> pending_hidden;  // [hidden]
  };
  struct Queued {
    int32_t p0 = 0;
    std::vector<int32_t> tokens;  // t_{j+1} for j = p0 ..
    std::vector<float> hidden;    // h_j rows
    std::vector<int32_t> pages;
    bool keep = false;            // keep every row's logits (take_logits)
  };
  struct Kept {
    int32_t start = 0;
    std::vector<float> logits;
  };
  void run_queued_of(std::vector<uint64_t> ids);        // run_queued over these requests' pairs only
  void run_queued_step(const std::vector<uint64_t>& ids);  // one MTP step over their pairs (sorted ids)
  // The device round (device_rounds): false when the batch or the backend cannot take it.
  bool device_round(const std::vector<SpecRequest>& requests, std::vector<SpecRoundResult>& out);
  int host_threads() const;  // threads, or its default
  // The host round's buffers, kept between rounds (speculative_host_round.cpp): the draft steps'
  // logits / states, the verify step's, the catch-up's, a masked row per request.
  std::vector<float> draft_logits_, draft_hidden_, verify_logits_, verify_hidden_, catchup_logits_, catchup_hidden_;
  std::vector<std::vector<float>> masked_rows_;
  std::unique_ptr<SpecSteps> own_;  // the CPU model's, when constructed from one
  SpecSteps& steps_;
  int32_t n_;
  std::unordered_map<uint64_t, State> state_;
  std::unordered_map<uint64_t, Queued> queue_;
  std::unordered_map<uint64_t, Kept> kept_;
};

}  // namespace fp4moe::model
