#include "engine/backend.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "engine/page_pool.hpp"

namespace fp4moe::engine {

void StepBatch::clear() {
  tokens.clear();
  positions.clear();
  token_begin.assign(1, 0);
  page_begin.assign(1, 0);
  page_ids.clear();
  request_ids.clear();
  sample.clear();
  sampling.clear();
  dump.clear();
  dumps = nullptr;
  await_token_masks = nullptr;
}

void StepBatch::add(uint64_t id, std::span<const int32_t> toks, int32_t start, std::span<const int32_t> pages,
                    bool samples, const SampleSpec& spec) {
  FP4MOE_CHECK(!toks.empty(), "a request in a step needs at least one token");
  FP4MOE_CHECK(int64_t(pages.size()) >= pages_for_tokens(int64_t(start) + int64_t(toks.size()), page_size),
               "request {}: {} pages cannot hold positions up to {}", id, pages.size(), start + toks.size());
  for (size_t t = 0; t < toks.size(); ++t) {
    tokens.push_back(toks[t]);
    positions.push_back(start + int32_t(t));
  }
  token_begin.push_back(int32_t(tokens.size()));
  page_ids.insert(page_ids.end(), pages.begin(), pages.end());
  page_begin.push_back(int32_t(page_ids.size()));
  request_ids.push_back(id);
  sample.push_back(samples ? 1 : 0);
  sampling.push_back(spec);
  dump.push_back(0);
}

KvBatchView StepBatch::kv_view(std::vector<int32_t>& kv_len, std::vector<int32_t>& sample_rows) const {
  const int32_t n = num_requests();
  kv_len.resize(size_t(n));
  sample_rows.clear();
  for (int32_t r = 0; r < n; ++r) {
    kv_len[size_t(r)] = start(r) + count(r);
    if (sample[size_t(r)]) sample_rows.push_back(token_begin[size_t(r) + 1] - 1);
  }
  return KvBatchView{n, num_tokens(), token_begin.data(), positions.data(), kv_len.data(), page_begin.data(),
                     page_ids.data()};
}

void Backend::decode(const StepBatch& batch, const DecodeLimits& limits, int32_t steps, DecodeOutput& out) {
  const int32_t n = batch.num_requests();
  FP4MOE_CHECK(int32_t(limits.max_new.size()) == n && int32_t(limits.stop_ids.size()) == n,
               "decode limits for {} requests, batch has {}", limits.max_new.size(), n);
  out.tokens.assign(size_t(n), {});
  std::vector<std::vector<int32_t>> generated(static_cast<size_t>(n));
  for (int32_t r = 0; r < n; ++r) {
    FP4MOE_CHECK(batch.count(r) == 1 && batch.sample[size_t(r)], "multi-step decode takes one sampling token per request");
    FP4MOE_CHECK(!batch.sampling[size_t(r)].grammar && !batch.sampling[size_t(r)].allowed_tokens,
                 "multi-step decode on the host cannot apply grammar masks (constrained requests run one step per round)");
    generated[size_t(r)].assign(batch.sampling[size_t(r)].generated.begin(), batch.sampling[size_t(r)].generated.end());
  }
  std::vector<uint8_t> active(size_t(n), 1);
  StepBatch sub;
  sub.page_size = batch.page_size;
  std::vector<int32_t> rows;  // sub-batch row -> request
  std::vector<GeneratedToken> sampled;
  for (int32_t j = 0; j < steps; ++j) {
    sub.clear();
    rows.clear();
    for (int32_t r = 0; r < n; ++r) {
      if (!active[size_t(r)]) continue;
      const auto& produced = out.tokens[size_t(r)];
      const int32_t token = produced.empty() ? batch.request_tokens(r)[0] : produced.back().id;
      SampleSpec spec = batch.sampling[size_t(r)];
      spec.output_index += j;
      spec.generated = generated[size_t(r)];
      sub.add(batch.request_ids[size_t(r)], {&token, 1}, batch.start(r) + j, batch.page_table(r), true, spec);
      rows.push_back(r);
    }
    if (rows.empty()) break;
    sampled.clear();
    step(sub, sampled);
    FP4MOE_CHECK(sampled.size() == rows.size(), "step returned {} tokens for {} requests", sampled.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t r = rows[i];
      auto& produced = out.tokens[size_t(r)];
      produced.push_back(std::move(sampled[i]));
      generated[size_t(r)].push_back(produced.back().id);
      const auto& stops = limits.stop_ids[size_t(r)];
      if (int32_t(produced.size()) >= limits.max_new[size_t(r)] ||
          std::find(stops.begin(), stops.end(), produced.back().id) != stops.end())
        active[size_t(r)] = 0;
    }
  }
}

RowDump& StepBatch::add_dump(int32_t r, DumpRows what, int64_t width) const {
  RowDump& d = dumps->emplace_back();
  d.request = r;
  d.what = what;
  d.start = start(r);
  d.rows = count(r);
  d.width = int32_t(width);
  d.data.assign(size_t(d.rows) * size_t(width), 0.0f);
  return d;
}

void StepBatch::add_hidden_dumps(int32_t r, int64_t width, const std::vector<std::vector<float>>& layers) const {
  const int64_t b = token_begin[size_t(r)];
  for (size_t l = 0; l < layers.size(); ++l) {
    RowDump& d = add_dump(r, kDumpHidden, width);
    d.layer = int32_t(l);
    std::copy(layers[l].begin() + b * width, layers[l].begin() + (b + d.rows) * width, d.data.begin());
  }
}

}  // namespace fp4moe::engine
