// The scheduler: waiting queue -> running batch -> Backend steps, single-threaded (the
// Engine runs it on its own thread; tests drive it directly).
//
// One round: admit waiting requests (FIFO) while the running cap, the step's prefill
// budget and the KV pages allow; then either one mixed step (every running request's
// pending tokens: decode tokens always, prefill chunks under --chunked-prefill-size) or,
// when every running request is decoding, K decode steps in one Backend::decode call
// (--num-continuous-decode-steps). When a decode token finds no page even after evicting
// the prefix cache, the newest running request is retracted: its pages are freed (its full
// pages indexed in the prefix cache first) and it goes back to the front of the queue with
// its generated tokens, to be recomputed and continued later: it is never dropped, and since
// the sampling draw depends only on (seed, output index) it produces the same tokens.
// Finished and cancelled requests free their pages at once. With speculative decoding, a
// decode round is one draft/verify round (Backend::decode) unless the batch dumps rows, holds a
// constrained request the backend cannot speculate on, or holds more requests than
// --speculative-disable-by-batch-size: then it is one plain step (Backend::step).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "engine/page_pool.hpp"
#include "engine/radix_cache.hpp"
#include "engine/request.hpp"

namespace fp4moe::engine {

class MaskFiller;

struct SchedulerConfig {
  int32_t page_size = 16;
  int32_t num_pages = 0;
  int32_t max_running = 64;           // --max-running-requests
  int32_t chunked_prefill_size = 512; // --chunked-prefill-size: prompt tokens per step (decode tokens ride along)
  int32_t decode_steps = 1;           // --num-continuous-decode-steps
  // Speculative decoding (--speculative-num-steps N): a round where every running request decodes
  // is one Backend::decode call of N + 1 steps = one draft/verify round (the backend emits 1 ..
  // N + 1 tokens per request); 0: off. Excludes decode_steps > 1.
  int32_t speculative_tokens = 0;
  // --speculative-disable-by-batch-size N (with speculation): a decode round whose running batch
  // holds more than N requests is one plain step (Backend::step, which keeps a speculating
  // backend's MTP layer caught up) instead of a draft/verify round; 0: speculate at every size.
  int32_t speculative_disable_by_batch_size = 0;
  bool radix_cache = true;            // ! --disable-radix-cache
  int32_t context_length = 0;         // tokens a request may reach (prompt + generated)
  std::vector<int32_t> eos_ids;       // stop unless ignore_eos
  // Fill the grammar masks of a step on a host thread while the backend runs its forward
  // (backends with BackendInfo::overlaps_token_masks); false: before the step, as others get.
  // The tokens are the same either way.
  bool overlap_token_masks = true;
};

struct SchedulerStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t pages_total = 0;
  int32_t pages_free = 0;
  int32_t pages_cached = 0;    // indexed by the prefix cache and referenced by no request
  int32_t pages_used = 0;      // referenced by a request
  int64_t tokens_in_use = 0;   // KV tokens of running requests
  // Since start:
  int64_t rounds = 0;
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // tokens computed by prefill chunks (including recomputation)
  int64_t cached_tokens = 0;   // prompt tokens served from the prefix cache
  int64_t decode_tokens = 0;   // tokens generated
  int64_t retractions = 0;
  int64_t verify_steps = 0;    // speculative draft/verify rounds
  // Speculating: decode rounds run as one plain step because the batch held more than
  // --speculative-disable-by-batch-size requests.
  int64_t spec_disabled_rounds = 0;
  int64_t finished = 0;
  int64_t aborted = 0;
  double backend_seconds = 0;  // wall time inside Backend::step / decode (the model, with the backend's own host work)
};

// Receives each request's events of a round (at most one per request and round).
using EventSink = std::function<void(uint64_t id, OutputEvent&& event)>;

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, Backend& backend);
  ~Scheduler();

  const SchedulerConfig& config() const { return cfg_; }
  // Queues a request (validated by the caller: prompt non-empty, prompt + max_new_tokens
  // within the context and the pool). Its seed must be set.
  void add(uint64_t id, RequestSpec spec);
  // Aborts a waiting or running request: its pages are freed now and an abort event is emitted.
  // Returns false when the id is unknown (finished already).
  bool cancel(uint64_t id, const std::string& why, const EventSink& sink);
  void cancel_all(const std::string& why, const EventSink& sink);
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // One scheduling round (one step, or K decode steps).
  void run_round(const EventSink& sink);
  // Frees every page only the prefix cache references; returns how many.
  int32_t flush_cache();
  SchedulerStats stats() const;
  // The largest token count one step can have (for Backend::init_kv).
  int32_t max_step_tokens() const { return cfg_.chunked_prefill_size + cfg_.max_running; }

  // Every request's pages plus the cache's add up to the pool's references (tests).
  void check_invariants() const;

 private:
  struct Sequence;
  using SeqPtr = std::unique_ptr<Sequence>;

  bool try_admit(Sequence& s, int32_t& evictable, int32_t reserved);
  bool ensure_pages(Sequence& s, int64_t tokens);   // pages covering `tokens` positions; evicts the cache if needed
  void retract(size_t index);                        // running_[index] -> front of the queue
  // Index its full pages (if cached), tell the backend (unless the round's release_requests did), drop its references.
  void release(Sequence& s, bool backend_told = false);
  void cache_prefix(Sequence& s);                    // index its full computed pages
  SampleSpec sample_spec(const Sequence& s) const;
  bool is_stop(const Sequence& s, int32_t token) const;

  SchedulerConfig cfg_;
  Backend& backend_;
  PagePool pool_;
  RadixCache cache_;
  std::deque<SeqPtr> waiting_;
  std::vector<SeqPtr> running_;  // admission order: newest last
  bool retracted_ = false;  // a retraction happened and nothing finished since
  SchedulerStats totals_;
  StepBatch batch_;
  std::vector<RowDump> step_dumps_;  // the rows a step's dumping requests got back (StepBatch::dumps)
  std::unique_ptr<MaskFiller> mask_filler_;  // created with the first overlapped step
};

}  // namespace fp4moe::engine
