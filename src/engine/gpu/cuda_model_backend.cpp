#include "engine/gpu/cuda_model_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "engine/sampling_cpu.hpp"

namespace fp4moe::engine::gpu {

namespace {

// The device's argmax is the whole answer: no logprobs, no penalties, greedy.
bool plain_greedy(const SampleSpec& s) {
  return s.params && s.params->greedy() && !s.params->has_penalties() && s.top_logprobs < 0;
}

}  // namespace

CudaModelBackend::CudaModelBackend(const CudaModelBackendOptions& options) : opt_(options) {
  runner_ = GpuRunner::load(opt_.model_dir, opt_.runner);
  size_t free_b = 0, total_b = 0;
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  device_bytes_ = int64_t(total_b);
}

CudaModelBackend::~CudaModelBackend() = default;

BackendInfo CudaModelBackend::info() const {
  const auto& c = runner_->config();
  BackendInfo i;
  i.name = "cuda";
  i.vocab_size = int32_t(c.vocab);
  i.max_context = int32_t(std::min<int64_t>({c.max_position_embeddings, runner_->options().max_context, INT32_MAX}));
  i.kv_bytes_per_token = runner_->kv_bytes_per_token();
  i.weight_bytes = runner_->weight_bytes();
  i.workspace_bytes = runner_->workspace_bytes();
  i.device_bytes = device_bytes_;
  i.default_mem_fraction = runner_->options().mem_fraction_static;
  i.kv_pool_tokens = runner_->num_pages() * runner_->page_size();
  return i;
}

void CudaModelBackend::init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) {
  FP4MOE_CHECK(page_size == runner_->page_size(), "cuda backend: page size {} but the runner was planned for {}",
               page_size, runner_->page_size());
  FP4MOE_CHECK(num_pages >= 1 && num_pages <= runner_->num_pages(),
               "cuda backend: {} KV pages asked for, the runner's pool holds {}", num_pages, runner_->num_pages());
  FP4MOE_CHECK(max_step_tokens <= runner_->options().max_tokens && max_requests <= runner_->options().max_requests,
               "cuda backend: steps of up to {} tokens / {} requests, the runner was sized for {} / {}",
               max_step_tokens, max_requests, runner_->options().max_tokens, runner_->options().max_requests);
  kv_len_.reserve(size_t(max_requests));
  kv_ready_ = true;
}

void CudaModelBackend::step(const StepBatch& batch, std::vector<GeneratedToken>& out) {
  FP4MOE_CHECK(kv_ready_, "cuda backend: step before init_kv");
  const int32_t n = batch.num_requests();
  StepInput in;
  kv_len_.resize(size_t(n));
  bool greedy = true;
  for (int32_t r = 0; r < n; ++r) {
    kv_len_[size_t(r)] = batch.start(r) + batch.count(r);
    if (!batch.sample[size_t(r)]) continue;
    in.logits_rows.push_back(batch.token_begin[size_t(r) + 1] - 1);  // its last token
    greedy = greedy && plain_greedy(batch.sampling[size_t(r)]);
  }
  in.tokens = batch.tokens.data();
  in.batch = KvBatchView{n, batch.num_tokens(), batch.token_begin.data(), batch.positions.data(), kv_len_.data(),
                         batch.page_begin.data(), batch.page_ids.data()};
  const int64_t vocab = runner_->config().vocab;
  StepOutput so;
  so.greedy = &greedy_;
  so.logits = greedy ? nullptr : &logits_;
  runner_->step(in, so);
  size_t k = 0;
  for (int32_t r = 0; r < n; ++r) {
    if (!batch.sample[size_t(r)]) continue;
    if (greedy) {
      GeneratedToken t;
      t.id = greedy_[k];
      out.push_back(std::move(t));
    } else {
      out.push_back(sample_row_cpu(logits_.data() + k * size_t(vocab), vocab, batch.sampling[size_t(r)]));
    }
    ++k;
  }
}

}  // namespace fp4moe::engine::gpu
