#include "backend/fake/fake_backend.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "backend/sampling_cpu.hpp"

namespace fp4moe::engine {
namespace {

constexpr uint64_t kUnwritten = 0xDEADBEEFDEADBEEFull;
constexpr uint64_t kStart = 0x0123456789ABCDEFull;

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool preferred(int32_t v) { return (v >= 'a' && v <= 'z') || v == ' ' || v == '.'; }

}  // namespace

FakeBackend::FakeBackend(FakeBackendOptions options) : opt_(options) {
  FP4MOE_CHECK(opt_.vocab_size > 128, "the fake backend needs a vocabulary over 128 tokens (got {})", opt_.vocab_size);
}

BackendInfo FakeBackend::info() const {
  BackendInfo i;
  i.name = "fake";
  i.applies_token_masks = true;  // sample_row_cpu
  i.overlaps_token_masks = true;  // step() waits for them before its first sample
  i.vocab_size = opt_.vocab_size;
  i.max_context = opt_.max_context;
  i.kv_bytes_per_token = int64_t(sizeof(uint64_t));
  return i;
}

void FakeBackend::init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) {
  page_size_ = page_size;
  max_step_tokens_ = max_step_tokens;
  kv_.assign(size_t(num_pages) * size_t(page_size), kUnwritten);
  if (!opt_.script.empty()) since_marker_.assign(kv_.size(), -1);
}

void FakeBackend::script_logits(int32_t since, std::vector<float>& logits) const {
  logits.assign(size_t(opt_.vocab_size), -10.0f);
  const size_t k = size_t(since - 1);
  const int32_t next = k < opt_.script.size() ? opt_.script[k] : opt_.eos_id;
  if (next >= 0 && next < opt_.vocab_size) logits[size_t(next)] = 20.0f;
}

void FakeBackend::logits_after(uint64_t entry, std::vector<float>& logits) const {
  logits.resize(size_t(opt_.vocab_size));
  for (int32_t v = 0; v < opt_.vocab_size; ++v)
    logits[size_t(v)] = preferred(v) ? float(mix(entry, uint64_t(v)) % 1000) / 100.0f : -10.0f;
  if (opt_.eos_id >= 0 && opt_.eos_id < opt_.vocab_size)
    logits[size_t(opt_.eos_id)] = opt_.eos_period > 0 && mix(entry, 0xE05) % uint64_t(opt_.eos_period) == 0 ? 11.0f : -5.0f;
}

void FakeBackend::step(const StepBatch& batch, std::vector<GeneratedToken>& out) {
  FP4MOE_CHECK(!kv_.empty(), "fake backend: step before init_kv");
  FP4MOE_CHECK(opt_.fail_after_steps < 0 || steps_ < opt_.fail_after_steps,
               "fake backend: device failure (--fake-fail-after-steps {})", opt_.fail_after_steps);
  FP4MOE_CHECK(batch.page_size == page_size_, "fake backend: batch page size {} != {}", batch.page_size, page_size_);
  FP4MOE_CHECK(batch.num_tokens() <= max_step_tokens_, "fake backend: step of {} tokens over the bound {}",
               batch.num_tokens(), max_step_tokens_);
  if (opt_.fail_request_token >= 0) {
    std::vector<uint64_t> bad;
    for (int32_t r = 0; r < batch.num_requests(); ++r) {
      const auto toks = batch.request_tokens(r);
      if (std::find(toks.begin(), toks.end(), opt_.fail_request_token) != toks.end())
        bad.push_back(batch.request_ids[size_t(r)]);
    }
    if (!bad.empty()) {
      std::string msg = fmt::format("fake backend: {} request(s) hold the failing token {}", bad.size(),
                                    opt_.fail_request_token);
      throw StepError(std::move(msg), std::move(bad));
    }
  }
  max_batch_tokens_ = std::max(max_batch_tokens_, batch.num_tokens());
  // The "forward" takes step_delay_us; the grammar masks may be filled meanwhile.
  if (opt_.step_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(opt_.step_delay_us));
  if (batch.await_token_masks) batch.await_token_masks();
  std::vector<int32_t> per_expert(size_t(opt_.num_experts), 0);
  auto slot = [&](std::span<const int32_t> table, int32_t pos) -> size_t {  // index into kv_ (and since_marker_)
    const int32_t page = table[size_t(pos / page_size_)];
    FP4MOE_CHECK(page >= 0 && size_t(page) * size_t(page_size_) < kv_.size(), "fake backend: bad page id {}", page);
    return size_t(page) * size_t(page_size_) + size_t(pos % page_size_);
  };
  for (int32_t r = 0; r < batch.num_requests(); ++r) {
    const auto table = batch.page_table(r);
    const auto toks = batch.request_tokens(r);
    uint64_t h = kStart;
    int32_t since = -1;  // script: tokens since the last marker
    const int32_t start = batch.start(r);
    if (start > 0) {
      const size_t prev = slot(table, start - 1);
      h = kv_[prev];
      FP4MOE_CHECK(h != kUnwritten, "fake backend: request {} reads position {}, never written", batch.request_ids[size_t(r)],
                   start - 1);
      if (!since_marker_.empty()) since = since_marker_[prev];
    }
    for (size_t t = 0; t < toks.size(); ++t) {
      h = mix(h, mix(uint64_t(uint32_t(toks[t])), uint64_t(start) + t));
      const size_t at = slot(table, start + int32_t(t));
      kv_[at] = h;
      if (!since_marker_.empty()) {
        since = toks[t] == opt_.script_marker ? 0 : since < 0 ? -1 : since + 1;
        since_marker_[at] = since;
      }
      ++per_expert[size_t(h % uint64_t(opt_.num_experts))];
      ++per_expert[size_t((h / 7 + 1) % uint64_t(opt_.num_experts))];
    }
    if (batch.sample[size_t(r)]) {
      if (since >= 1)
        script_logits(since, logits_);
      else if (opt_.uniform_logits)
        logits_.assign(size_t(opt_.vocab_size), 0.0f);
      else
        logits_after(h, logits_);
      out.push_back(sample_row_cpu(logits_.data(), int64_t(logits_.size()), batch.sampling[size_t(r)]));
    }
  }
  if (observer_) observer_->on_moe_gemm(0, per_expert);
  ++steps_;
}

}  // namespace fp4moe::engine
