#include "engine/cpu_model_backend.hpp"

#include <unistd.h>

#include <filesystem>
#include <new>

#include <fmt/format.h>

#include "core/error.hpp"
#include "engine/sampling_cpu.hpp"

namespace fp4moe::engine {

CpuModelBackend::CpuModelBackend(const CpuModelBackendOptions& options) : opt_(options) {
  model::ModelOptions mo;
  mo.threads = opt_.threads;
  mo.on_moe_routing = [this](int64_t layer, std::span<const int32_t> per_expert) {
    if (observer_) observer_->on_moe_gemm(int32_t(layer), per_expert);
  };
  model_ = model::Model::load(opt_.model_dir, mo);
  std::error_code ec;  // the shards the model mmap'd (regular files; anything else was refused or is unused)
  for (const auto& e : std::filesystem::directory_iterator(opt_.model_dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) weight_bytes_ += int64_t(e.file_size(ec));
}

BackendInfo CpuModelBackend::info() const {
  const auto& c = model_->config();
  BackendInfo i;
  i.name = "cpu";
  i.applies_token_masks = true;  // sample_row_cpu
  i.vocab_size = int32_t(c.vocab);
  i.max_context = int32_t(std::min<int64_t>(c.max_position_embeddings, INT32_MAX));
  const PagedKvGeometry g = model_->kv_geometry(1, 1, opt_.kv_elem);
  const auto index_layers = model_->kv_index_layers();
  int64_t per_token = 0;
  for (int64_t l = 0; l < g.num_layers; ++l)
    per_token += int64_t(g.ckv_bytes() + g.kpe_bytes() + (index_layers[size_t(l)] ? g.index_bytes() : 0));
  i.kv_bytes_per_token = per_token;
  i.weight_bytes = weight_bytes_;  // mmap'd: counted against the host's memory
  i.device_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  return i;
}

void CpuModelBackend::init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) {
  kv_ = std::make_unique<model::HostKvPool>(model_->kv_geometry(page_size, num_pages, opt_.kv_elem),
                                            model_->kv_index_layers());
  kv_len_.reserve(size_t(max_requests));
  logits_.reserve(size_t(max_requests) * size_t(model_->config().vocab));
}

void CpuModelBackend::step(const StepBatch& batch, std::vector<GeneratedToken>& out) {
  FP4MOE_CHECK(kv_, "cpu backend: step before init_kv");
  const int32_t n = batch.num_requests();
  const KvBatchView view = batch.kv_view(kv_len_, rows_);
  const int64_t vocab = model_->config().vocab;
  logits_.resize(rows_.size() * size_t(vocab));
  // The host model keeps no state across a failed step (its scratch arena resets per step, the
  // batch's KV pages are freed with its requests): an error or a failed allocation fails this
  // batch's requests only (StepError), and the engine goes on serving.
  try {
    model_->step(TensorView::of(batch.tokens.data(), {batch.num_tokens()}), view, *kv_, rows_,
                 TensorView::of(logits_.data(), {int64_t(rows_.size()), vocab}));
  } catch (const Error& e) {
    throw StepError(e.what());
  } catch (const std::bad_alloc&) {
    throw StepError(fmt::format("out of memory in a step of {} tokens", batch.num_tokens()));
  }
  size_t k = 0;
  for (int32_t r = 0; r < n; ++r)
    if (batch.sample[size_t(r)]) {
      out.push_back(sample_row_cpu(logits_.data() + k * size_t(vocab), vocab, batch.sampling[size_t(r)]));
      ++k;
    }
}

}  // namespace fp4moe::engine
