// The Backend the scheduler drives: one model step over a flat batch, and K decode steps in
// one call. The CPU model, the GPU runner (CUDA graphs per batch-size bucket, K steps on the
// device) and the deterministic fake used by the tests implement it.
//
// A step's batch is flat: the tokens of every request back to back (a prefill chunk or one
// decode token each), their positions, and per request its page table. Token t of request r
// sits at position p = start(r) + t; its KV goes to page page_table(r)[p / page_size], slot
// p % page_size. The page table covers every position up to start + n_tokens (for K decode
// steps, up to start + K): the engine allocated those pages before the call. Pages that
// hold a shared prefix (radix cache) lie below start and are only read.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/paged_kv.hpp"
#include "engine/request.hpp"

namespace fp4moe::grammar {
class Matcher;
}

namespace fp4moe::engine {

// How one request samples after its last token of the step.
struct SampleSpec {
  const SamplingParams* params = nullptr;
  int32_t output_index = 0;   // which generated token this is; with params->seed it fixes the draw
  std::span<const int32_t> prompt;     // for the repetition penalty
  std::span<const int32_t> generated;  // tokens generated so far (penalties)
  // Constrained decoding: a vocabulary bitmask (bit v % 32 of word v / 32 set = token v may be
  // sampled), or null. Valid for the call; the sampler sets every other logit to -inf first.
  const uint32_t* allowed_tokens = nullptr;
  // Constrained decoding in a speculative round (Backend::decode of a backend with
  // BackendInfo::speculates_constrained; allowed_tokens is then null): the request's grammar
  // matcher, in the state after its generated tokens. The backend masks every row of the round
  // by it (advancing it over the drafts) and returns it in that state; the scheduler advances
  // it over the tokens emitted. Only the engine thread touches it during the call.
  grammar::Matcher* grammar = nullptr;
};

struct StepBatch {
  int32_t page_size = 0;
  // Per token, flat.
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  // Per request r (CSR): its tokens are tokens[token_begin[r], token_begin[r+1]), its page
  // table page_ids[page_begin[r], page_begin[r+1]).
  std::vector<int32_t> token_begin{0};
  std::vector<int32_t> page_begin{0};
  std::vector<int32_t> page_ids;
  std::vector<uint64_t> request_ids;  // the engine's ids (stable across steps; a backend may key state on them)
  // Whether request r samples after its last token (false for a prefill chunk that does not end its prompt).
  std::vector<uint8_t> sample;
  std::vector<SampleSpec> sampling;   // per request; read where sample[r]
  // Per request: the DumpRows it asks back this step (0 for almost all). A backend with
  // BackendInfo::dumps_rows appends them to *dumps (RowDump::request = r); null when none asks.
  std::vector<uint8_t> dump;
  std::vector<RowDump>* dumps = nullptr;
  // Constrained decoding overlapped with the forward: when set, the allowed_tokens masks are
  // still being filled on a host thread. A backend that declares
  // BackendInfo::overlaps_token_masks calls it (it blocks until they are complete; calling it
  // again is free) after launching its forward and before it reads any allowed_tokens;
  // the scheduler never sets it for any other backend (it fills the masks before step()).
  std::function<void()> await_token_masks;

  // Appends to *dumps a RowDump of request r's rows this step (what, layer 0, start(r), count(r)
  // rows of `width` values, data sized and zero) for the backend to fill.
  RowDump& add_dump(int32_t r, DumpRows what, int64_t width) const;
  // Appends request r's kDumpHidden rows: its tokens' rows of each layer's [tokens, width] array
  // (layers: the embeddings, then after each layer; a backend's hidden states).
  void add_hidden_dumps(int32_t r, int64_t width, const std::vector<std::vector<float>>& layers) const;

  int32_t num_requests() const { return int32_t(request_ids.size()); }
  int32_t num_tokens() const { return int32_t(tokens.size()); }
  int32_t start(int32_t r) const { return positions[size_t(token_begin[size_t(r)])]; }
  int32_t count(int32_t r) const { return token_begin[size_t(r) + 1] - token_begin[size_t(r)]; }
  std::span<const int32_t> request_tokens(int32_t r) const {
    return {tokens.data() + token_begin[size_t(r)], size_t(count(r))};
  }
  std::span<const int32_t> page_table(int32_t r) const {
    return {page_ids.data() + page_begin[size_t(r)], size_t(page_begin[size_t(r) + 1] - page_begin[size_t(r)])};
  }
  void clear();
  // Appends request r; its page table must cover start + tokens.size() (checked).
  void add(uint64_t id, std::span<const int32_t> toks, int32_t start, std::span<const int32_t> pages, bool samples,
           const SampleSpec& spec);
  // The batch as core/paged_kv.hpp's view (host pointers into this batch and kv_len), with
  // kv_len[r] = start + count and sample_rows = the last token of every request that samples.
  KvBatchView kv_view(std::vector<int32_t>& kv_len, std::vector<int32_t>& sample_rows) const;
};

// Per-request limits of a K-step decode: request r produces at most max_new[r] tokens and
// stops after producing one of its stop ids.
struct DecodeLimits {
  std::vector<int32_t> max_new;                   // per request, >= 1
  std::vector<std::vector<int32_t>> stop_ids;     // per request (its stop ids, plus the EOS ids unless ignore_eos)
};

// The tokens a multi-step call produced: request r's are tokens[r] (1..K of them; fewer than
// K only when it hit a stop id or its max_new).
struct DecodeOutput {
  std::vector<std::vector<GeneratedToken>> tokens;
};

// Sees what the backend computed, for /metrics; called on the engine thread, so it must be
// cheap (a few atomic adds and one lock per call at most).
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // One model step over `requests` requests and `tokens` tokens (the scheduler reports it: a
  // K-step decode call is K steps, each over the requests still producing at that step).
  virtual void on_step(int32_t requests, int32_t tokens) = 0;
  // One grouped MoE GEMM of one layer: tokens_per_expert[e] = tokens routed to routed expert e
  // (zeros included). The backend reports it: the CPU backend from its routing; the GPU runner
  // from the per-expert offsets its permute step computes (copied back with the step's
  // outputs, never a sync of its own).
  virtual void on_moe_gemm(int32_t layer, std::span<const int32_t> tokens_per_expert) = 0;
  // Speculative decoding: one request's draft/verify round drafted `drafted` tokens, of which
  // `accepted` were accepted, and emitted `emitted` (its accept length). Default: not counted.
  virtual void on_speculative(int32_t drafted, int32_t accepted, int32_t emitted) {}
};

struct BackendInfo {
  std::string name;               // "cpu", "cuda", "fake"
  int32_t vocab_size = 0;
  int32_t max_context = 0;        // positions the model supports
  int64_t kv_bytes_per_token = 0; // KV bytes one token takes over all layers
  int64_t weight_bytes = 0;
  int64_t workspace_bytes = 0;    // activations etc. for the largest step
  int64_t device_bytes = 0;       // memory of the device the KV pool lives on (0: unknown)
  // The KV pool's default when neither --max-total-tokens nor --mem-fraction-static is given:
  // this fraction of device_bytes (the GPU runner: 0.88), or 0 for a fixed token count (the
  // host backends, which share the machine's memory).
  double default_mem_fraction = 0.0;
  // > 0: the backend planned its KV pool itself at load (the GPU runner: weights, workspace,
  // then the pool from --mem-fraction-static / --max-total-tokens); the plan takes this many tokens.
  int64_t kv_pool_tokens = 0;
  // The backend's sampler honours SampleSpec::allowed_tokens (constrained decoding). A backend
  // that does not gets no constrained request (the scheduler refuses it, the server says 400).
  bool applies_token_masks = false;
  // Which RequestSpec::dump bits step() honours (DumpRows; 0: none). The scheduler refuses a request
  // asking for others.
  uint8_t dumps_rows = 0;
  // The backend calls StepBatch::await_token_masks before its sampler reads the masks, so the
  // scheduler may fill them while the forward runs (step() only; decode() gets no masks).
  bool overlaps_token_masks = false;
  // decode()'s speculative round honours SampleSpec::grammar: batches holding constrained
  // requests get speculative rounds (else those batches run one plain step per round).
  bool speculates_constrained = false;
};

// Thrown by Backend::step / decode for a failure that leaves the backend able to serve other
// requests (a request whose preparation failed, a host allocation too large for this batch):
// the scheduler aborts the requests named (every request of the batch when none is named),
// frees their pages and goes on. Any other exception from a backend marks the engine failed
// (a CUDA sticky error, a broken device) and serving stops.
class StepError : public Error {
 public:
  explicit StepError(std::string msg, std::vector<uint64_t> request_ids = {})
      : Error(std::move(msg)), request_ids(std::move(request_ids)) {}
  std::vector<uint64_t> request_ids;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendInfo info() const = 0;

  // Allocates the KV pool (num_pages pages of page_size tokens); called once before any step.
  // max_step_tokens / max_requests bound every later batch (workspaces, graph buckets).
  virtual void init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) = 0;

  // One forward step over the batch; appends one GeneratedToken per request with sample[r],
  // in request order, to out.
  virtual void step(const StepBatch& batch, std::vector<GeneratedToken>& out) = 0;

  // K decode steps: every request has exactly one token (its last generated one) and
  // samples. The token sampled at step j is the input of step j + 1; a request stops
  // producing after a stop id or max_new tokens. The default loops step() on the host (the
  // CPU backend's multi-step); the GPU runner overrides it to keep the K steps on the device.
  // A backend built with speculative decoding (the cpu and cuda backends with
  // speculative_steps > 0) makes EVERY decode() call one draft/verify round of
  // min(N, steps − 1, max_new[r] − 1) drafts per request (the scheduler passes steps = N + 1:
  // 1 .. N + 1 tokens per request); it has no plain multi-step decode. The scheduler runs a plain
  // decode round on such a backend (a batch above --speculative-disable-by-batch-size, dumping or
  // constrained where it cannot speculate) as one step(): step() also runs the MTP layer over the
  // pairs it completed, so the MTP layer's KV, position and next draft stay what a round leaves.
  virtual void decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out);

  // Requests left the running batch (finished, aborted or retracted; those of one round in one
  // call): per-request state keyed on their ids (penalty counts, graph slots, speculative state)
  // can go. Their pages are still theirs during the call and go back to the pool after it (a
  // speculating backend runs their waiting MTP pairs over them, batched).
  virtual void release_requests(std::span<const uint64_t> request_ids) {}

  void set_observer(StepObserver* observer) { observer_ = observer; }
  StepObserver* observer() const { return observer_; }

 protected:
  StepObserver* observer_ = nullptr;
};

}  // namespace fp4moe::engine
