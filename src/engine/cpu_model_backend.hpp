// The CPU backend: model::Model's forward step over the engine's flat batch and paged KV
// (model::HostKvPool's arrays, addressed by the engine's page ids), sampled on the host.
// K-step decode is Backend's host loop.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/paged_kv.hpp"
#include "engine/backend.hpp"
#include "model/kv_pool.hpp"
#include "model/model.hpp"

namespace fp4moe::engine {

struct CpuModelBackendOptions {
  std::string model_dir;
  int threads = 0;                 // 0: default_num_threads()
  KvElem kv_elem = KvElem::BF16;   // --kv-cache-dtype
};

class CpuModelBackend : public Backend {
 public:
  explicit CpuModelBackend(const CpuModelBackendOptions& options);
  BackendInfo info() const override;
  void init_kv(int32_t num_pages, int32_t page_size, int32_t max_step_tokens, int32_t max_requests) override;
  void step(const StepBatch& batch, std::vector<GeneratedToken>& out) override;
  const model::Model& model() const { return *model_; }

 private:
  CpuModelBackendOptions opt_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::HostKvPool> kv_;
  int64_t weight_bytes_ = 0;
  std::vector<int32_t> kv_len_, rows_;
  std::vector<float> logits_;
};

}  // namespace fp4moe::engine
