// MlaDecodeMma: validation, the split schedule (host) and the launches (mla_decode_mma.cu).
#include "cuda/attention/mla_decode.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/attention/mla_decode_params.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe::cuda::attention {
namespace {

bool fp8_of(const MlaDesc& d) { return d.kv_elem == KvElem::FP8_E4M3; }

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

namespace decode {

Schedule build_schedule(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& table_offset, int slots,
                        int tile_keys) {
  Schedule s;
  const double total = std::accumulate(kv_len.begin(), kv_len.end(), 0.0);
  for (size_t t = 0; t < kv_len.size(); ++t) {
    const int L = kv_len[t];
    const int tiles = int((int64_t(L) + tile_keys - 1) / tile_keys);
    const double share = total > 0 ? double(slots) * double(L) / total : 1;  // its share of the slots
    const auto [n, per_tiles] = split_parts(tiles, int(std::min<double>(share, tiles)));
    if (n == 1) {
      s.items.push_back({int32_t(t), 0, L, -1, table_offset[t], {0, 0, 0}});
      continue;
    }
    const int per = per_tiles * tile_keys;
    s.merges.push_back({int32_t(t), s.partials, n, 0});
    for (int i = 0; i < n; ++i)
      s.items.push_back({int32_t(t), i * per, std::min(L, (i + 1) * per), s.partials++, table_offset[t], {0, 0, 0}});
  }
  // Longest first: the GPU hands CTAs out in order, so the tail of the grid is the short ones.
  std::stable_sort(s.items.begin(), s.items.end(), [](const Item& a, const Item& b) {
    return a.kv_end - a.kv_start > b.kv_end - b.kv_start;
  });
  return s;
}

}  // namespace decode

std::string mla_decode_can_implement(const MlaDesc& d, DecodeMath math) {
  if (d.kv_elem != KvElem::BF16 && d.kv_elem != KvElem::FP8_E4M3)
    return fmt::format("MLA decode (mma): KV element {} unsupported (bf16 or fp8_e4m3)", kv_elem_name(d.kv_elem));
  // The dims first, with a device that allows everything: they need no GPU, so a caller without
  // one gets their reason rather than a CUDA error.
  const bool ws = math == DecodeMath::kWgmmaWs || math == DecodeMath::kWgmmaWsQRegs;
  const std::string dims = decode::can_implement(d.num_heads, fp8_of(d), d.sm_scale, INT64_MAX, 90, false, ws);
  if (!dims.empty()) return dims;
  int dev = 0, smem = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&dev));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return decode::can_implement(d.num_heads, fp8_of(d), d.sm_scale, smem, current_device_sm(),
                               math == DecodeMath::kWgmma, ws);
}

MlaDecodeMma::MlaDecodeMma(const MlaDesc& desc, DecodeMath math)
    : desc_(desc),
      wgmma_(math == DecodeMath::kWgmma),
      warp_specialized_(math == DecodeMath::kWgmmaWs || math == DecodeMath::kWgmmaWsQRegs),
      ws_q_regs_(math == DecodeMath::kWgmmaWsQRegs) {
  const std::string why = mla_decode_can_implement(desc, math);
  FP4MOE_CHECK(why.empty(), "{}", why);
  num_sm_ = cuda::current_device().sm_count;
  FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
}

MlaDecodeMma::~MlaDecodeMma() {
  if (copied_) cudaEventSynchronize(copied_), cudaEventDestroy(copied_);
  cudaFreeHost(pinned_);
  cudaFree(int_ws_);
  cudaFree(float_ws_);
  cudaFree(dev_float_ws_);
}

void MlaDecodeMma::plan(const KvBatchView& b, int64_t page_size, int64_t num_pages, cudaStream_t stream) {
  check_prefill_batch(b, page_size, num_pages);
  const int shift = log2_exact(page_size);
  FP4MOE_CHECK(shift >= 0, "MLA decode (mma): page_size {} must be a power of two", page_size);
  std::vector<int32_t> kv_len(size_t(b.num_requests)), table(size_t(b.num_requests));
  for (int64_t r = 0; r < b.num_requests; ++r) {
    FP4MOE_CHECK(b.qo_indptr[r + 1] - b.qo_indptr[r] == 1 && b.qo_indptr[r] == r,
                 "MLA decode (mma): request {} has {} new tokens; the decode kernel takes exactly one per request "
                 "(prefill chunks: MlaSm90 / MlaPrefillExpandedSm90)",
                 r, b.qo_indptr[r + 1] - b.qo_indptr[r]);
    kv_len[size_t(r)] = b.kv_len[r];
    table[size_t(r)] = b.page_indptr[r];
  }
  plan_items(kv_len, table, shift, stream);
  sparse_ = false;
  page_size_ = page_size;
}

void MlaDecodeMma::plan_sparse(const KvBatchView& b, int top_k, cudaStream_t stream) {
  FP4MOE_CHECK(b.num_tokens >= 1 && top_k >= 1, "MLA decode (mma) sparse plan: tokens {} and top_k {} must be >= 1",
               b.num_tokens, top_k);
  FP4MOE_CHECK(b.positions, "MLA decode (mma) sparse plan: positions are null");
  std::vector<int32_t> kv_len(size_t(b.num_tokens)), table(size_t(b.num_tokens));
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    FP4MOE_CHECK(b.positions[t] >= 0, "MLA decode (mma) sparse plan: token {} at position {}", t, b.positions[t]);
    FP4MOE_CHECK(int64_t(t) * top_k < (int64_t(1) << 31), "MLA decode (mma) sparse plan: too many rows");
    kv_len[size_t(t)] = std::min<int32_t>(top_k, b.positions[t] + 1);
    table[size_t(t)] = int32_t(t * top_k);
  }
  plan_items(kv_len, table, 0, stream);
  sparse_ = true;
}

void MlaDecodeMma::plan_items(const std::vector<int32_t>& kv_len, const std::vector<int32_t>& table_offset,
                              int page_shift, cudaStream_t stream) {
  const bool fp8 = fp8_of(desc_);
  const int tile = decode::tile_keys(fp8, wgmma_, warp_specialized_);
  const int head_groups = desc_.num_heads / decode::kHeadsPerCta;
  const decode::Schedule sch =
      decode::build_schedule(kv_len, table_offset, std::max(1, num_sm_ / head_groups), tile);
  const std::vector<decode::Item>& items = sch.items;
  const std::vector<decode::Merge>& merges = sch.merges;
  const int partials = sch.partials;
  FP4MOE_CHECK(merges.size() <= 65535, "MLA decode (mma): {} split tokens (at most 65535)", merges.size());

  const size_t item_bytes = items.size() * sizeof(decode::Item), merge_bytes = merges.size() * sizeof(decode::Merge);
  const size_t int_need = round_up(item_bytes, 256) + round_up(merge_bytes, 256) + 256;
  const size_t float_need = round_up(size_t(partials) * desc_.num_heads * decode::kCkv * sizeof(float), 256) +
                            round_up(size_t(partials) * desc_.num_heads * sizeof(float), 256) + 256;
  FP4MOE_CUDA_CHECK(cudaEventSynchronize(copied_));  // the staging buffer may still be read
  if (int_need > int_bytes_ || float_need > float_bytes_) {
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // a previous run may still read the old buffers
    if (int_need > int_bytes_) {
      cudaFree(int_ws_), cudaFreeHost(pinned_);
      int_ws_ = pinned_ = nullptr;
      int_bytes_ = std::max(int_need, int_bytes_ * 2);
      FP4MOE_CUDA_CHECK(cudaMalloc(&int_ws_, int_bytes_));
      FP4MOE_CUDA_CHECK(cudaMallocHost(&pinned_, int_bytes_));
    }
    if (float_need > float_bytes_) {
      cudaFree(float_ws_);
      float_ws_ = nullptr;
      float_bytes_ = std::max(float_need, float_bytes_ * 2);
      FP4MOE_CUDA_CHECK(cudaMalloc(&float_ws_, float_bytes_));
    }
  }
  auto* staged = static_cast<unsigned char*>(pinned_);
  std::memcpy(staged, items.data(), item_bytes);
  if (merge_bytes) std::memcpy(staged + round_up(item_bytes, 256), merges.data(), merge_bytes);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(int_ws_, pinned_, round_up(item_bytes, 256) + merge_bytes, cudaMemcpyHostToDevice,
                                    stream));
  FP4MOE_CUDA_CHECK(cudaEventRecord(copied_, stream));
  items_ = int(items.size());
  merges_ = int(merges.size());
  partials_ = partials;
  page_shift_ = page_shift;
  tokens_ = int(kv_len.size());
  planned_ = true;
}

namespace {

// The checks and kernel parameters shared by run() and run_device(): everything but the
// schedule (items, merges, page_shift) and the partial buffers' places.
decode::Params base_params(const MlaDesc& d, const MlaRunArgs& a, const char* who) {
  const KvLayerView& L = a.layer;
  FP4MOE_CHECK(L.elem == d.kv_elem, "MLA decode (mma) {}: cache is {}, built for {}", who, kv_elem_name(L.elem),
               kv_elem_name(d.kv_elem));
  FP4MOE_CHECK(L.ckv_dim == kCkvDim && L.kpe_dim == kKpeDim,
               "MLA decode (mma) {}: ckv/kpe dims {}/{} (the kernel is built for {}/{})", who, L.ckv_dim, L.kpe_dim,
               kCkvDim, kKpeDim);
  FP4MOE_CHECK(a.q_nope && a.q_pe && L.ckv && L.kpe && a.kv_indices && a.out,
               "MLA decode (mma) {}: a required pointer is null", who);
  const bool fp8 = fp8_of(d);
  FP4MOE_CHECK(!fp8 || (L.ckv_scale > 0 && L.kpe_scale > 0), "MLA decode (mma) {}: FP8 scales must be positive", who);
  decode::Params p{};
  p.q_nope = static_cast<const uint16_t*>(a.q_nope);
  p.q_pe = static_cast<const uint16_t*>(a.q_pe);
  p.ckv = static_cast<const uint8_t*>(L.ckv);
  p.kpe = static_cast<const uint8_t*>(L.kpe);
  p.kv_indices = a.kv_indices;
  p.num_heads = d.num_heads;
  p.sm_scale = d.sm_scale;
  p.ckv_scale = fp8 ? L.ckv_scale : 1.f;
  p.kpe_scale = fp8 ? L.kpe_scale : 1.f;
  p.out = static_cast<uint16_t*>(a.out);
  p.lse = a.lse;
  return p;
}

// part_o [partials, heads, 512] then part_lse [partials, heads] in one float workspace.
void set_partials(decode::Params& p, void* float_ws, int partials) {
  p.part_o = static_cast<float*>(float_ws);
  p.part_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(float_ws) +
                                        round_up(size_t(partials) * p.num_heads * decode::kCkv * sizeof(float), 256));
}

}  // namespace

void MlaDecodeMma::run(const MlaRunArgs& a, cudaStream_t stream) const {
  FP4MOE_CHECK(planned_, "MLA decode (mma) run: plan() first");
  FP4MOE_CHECK(sparse_ || a.layer.page_size == page_size_, "MLA decode (mma) run: page_size {} (planned {})",
               a.layer.page_size, page_size_);
  decode::Params p = base_params(desc_, a, "run");
  p.items = static_cast<const decode::Item*>(int_ws_);
  p.merges = reinterpret_cast<const decode::Merge*>(static_cast<const unsigned char*>(int_ws_) +
                                                     round_up(size_t(items_) * sizeof(decode::Item), 256));
  p.page_shift = page_shift_;
  set_partials(p, float_ws_, partials_);
  FP4MOE_CUDA_CHECK(decode::launch(fp8_of(desc_), p, items_, desc_.num_heads / decode::kHeadsPerCta, merges_, stream,
                                   false, wgmma_, warp_specialized_, ws_q_regs_));
}

// ---- device-scheduled runs (graph-capturable) ----
// Every split row has splits >= 2 only when tokens * splits <= slots, so the partial rows and
// merges never exceed `slots` (the CTA slots per head group), whatever the batch.

int MlaDecodeMma::device_splits(int tokens, int max_keys) const {
  const int slots = std::max(1, num_sm_ / (desc_.num_heads / decode::kHeadsPerCta));
  const int tile = decode::tile_keys(fp8_of(desc_), wgmma_, warp_specialized_);
  const int64_t tiles = (int64_t(std::max(max_keys, 1)) + tile - 1) / tile;
  return int(std::clamp<int64_t>(slots / std::max(tokens, 1), 1, std::max<int64_t>(1, tiles / 2)));
}

void MlaDecodeMma::reserve_device(int max_tokens) {
  FP4MOE_CHECK(max_tokens >= 1, "MLA decode (mma) reserve: {} rows", max_tokens);
  if (max_tokens <= dev_tokens_) return;
  const int slots = std::max(1, num_sm_ / (desc_.num_heads / decode::kHeadsPerCta));
  const size_t float_bytes = round_up(size_t(slots) * desc_.num_heads * decode::kCkv * sizeof(float), 256) +
                             size_t(slots) * desc_.num_heads * sizeof(float);
  if (dev_float_ws_ == nullptr) {  // the partial rows: a fixed size (the schedule has no arrays)
    FP4MOE_CUDA_CHECK(cudaMalloc(&dev_float_ws_, float_bytes));
  }
  dev_tokens_ = max_tokens;
}

void MlaDecodeMma::run_device(const MlaRunArgs& a, const MlaDeviceRows& rows, cudaStream_t stream) const {
  FP4MOE_CHECK(rows.tokens >= 1 && rows.tokens <= dev_tokens_,
               "MLA decode (mma) run_device: {} rows (reserve_device reserved {})", rows.tokens, dev_tokens_);
  const bool sparse = rows.top_k > 0;
  FP4MOE_CHECK(sparse ? rows.positions != nullptr : (rows.kv_len && rows.page_indptr),
               "MLA decode (mma) run_device: the rows' device arrays are null");
  const int shift = sparse ? 0 : log2_exact(rows.page_size);
  FP4MOE_CHECK(sparse || (shift >= 0 && rows.page_size == a.layer.page_size),
               "MLA decode (mma) run_device: page_size {} (the layer's {}; a power of two)", rows.page_size,
               a.layer.page_size);
  decode::Params p = base_params(desc_, a, "run_device");
  const bool fp8 = fp8_of(desc_);
  const int slots = std::max(1, num_sm_ / (desc_.num_heads / decode::kHeadsPerCta));
  const int splits = device_splits(rows.tokens, sparse ? std::min(rows.max_keys, rows.top_k) : rows.max_keys);
  const int items = rows.tokens * splits, merges = splits > 1 ? rows.tokens : 0;
  FP4MOE_CHECK(merges <= slots && (splits == 1 || items <= slots), "MLA decode (mma) run_device: split grid");

  // No schedule arrays: each CTA computes its item / merge from the row's length (p.sched).
  p.items = nullptr;
  p.merges = nullptr;
  p.sched.kv_len = rows.kv_len;
  p.sched.page_indptr = rows.page_indptr;
  p.sched.positions = rows.positions;
  p.sched.top_k = sparse ? rows.top_k : 0;
  p.sched.tokens = rows.tokens;
  p.sched.splits = splits;
  p.sched.tile_keys = decode::tile_keys(fp8, wgmma_, warp_specialized_);
  p.page_shift = shift;
  set_partials(p, dev_float_ws_, slots);
  FP4MOE_CUDA_CHECK(
      decode::launch(fp8, p, items, desc_.num_heads / decode::kHeadsPerCta, merges, stream, rows.pdl, wgmma_, warp_specialized_,
                                                ws_q_regs_));
}

}  // namespace fp4moe::cuda::attention
