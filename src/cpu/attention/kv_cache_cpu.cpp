#include "cpu/attention/kv_cache_cpu.hpp"

#include <cstring>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "format/codecs.hpp"

namespace fp4moe::cpu {

void kv_encode(KvElem elem, float scale, const float* x, int64_t n, void* dst) {
  switch (elem) {
    case KvElem::F32: std::memcpy(dst, x, size_t(n) * 4); return;
    case KvElem::BF16: {
      bfloat16* d = static_cast<bfloat16*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = bfloat16(x[i]);
      return;
    }
    case KvElem::FP8_E4M3: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      const float inv = 1.0f / scale;
      for (int64_t i = 0; i < n; ++i) d[i] = e4m3_from_float(x[i] * inv);
      return;
    }
  }
}

void kv_decode(KvElem elem, float scale, const void* base, int64_t offset, int64_t n, float* out) {
  switch (elem) {
    case KvElem::F32: std::memcpy(out, static_cast<const float*>(base) + offset, size_t(n) * 4); return;
    case KvElem::BF16: {
      const bfloat16* s = static_cast<const bfloat16*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = s[i].to_float();
      return;
    }
    case KvElem::FP8_E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_float(s[i]) * scale;
      return;
    }
  }
}

namespace {

void* row_ptr(void* base, KvElem elem, int64_t slot, int64_t dim) {
  return static_cast<uint8_t*>(base) + size_t(slot * dim) * kv_elem_size(elem);
}

void check_scale(KvElem elem, float scale, const char* what) {
  FP4MOE_CHECK(elem != KvElem::FP8_E4M3 || (scale > 0.0f && scale < 1e30f), "KV cache: {} FP8 scale {} is not positive",
               what, scale);
}

}  // namespace

void kv_append_cpu(const KvLayerView& L, const KvBatchView& b, const float* ckv, const float* kpe,
                   const float* index_k) {
  validate_kv_batch(b, L.page_size, L.num_pages);
  FP4MOE_CHECK(L.ckv && L.kpe, "kv_append_cpu: the layer has no ckv/kpe arrays");
  FP4MOE_CHECK(!index_k || L.index_k, "kv_append_cpu: index keys given but the layer has no index_k array");
  check_scale(L.elem, L.ckv_scale, "ckv");
  check_scale(L.elem, L.kpe_scale, "kpe");
  if (index_k) check_scale(L.index_elem, L.index_scale, "index_k");
  for (int64_t r = 0; r < b.num_requests; ++r)
    for (int64_t t = b.qo_indptr[r]; t < b.qo_indptr[r + 1]; ++t) {
      const int64_t slot = kv_slot(b, L.page_size, r, b.positions[t]);
      if (ckv) kv_encode(L.elem, L.ckv_scale, ckv + t * L.ckv_dim, L.ckv_dim, row_ptr(L.ckv, L.elem, slot, L.ckv_dim));
      if (kpe) kv_encode(L.elem, L.kpe_scale, kpe + t * L.kpe_dim, L.kpe_dim, row_ptr(L.kpe, L.elem, slot, L.kpe_dim));
      if (index_k)
        kv_encode(L.index_elem, L.index_scale, index_k + t * L.index_dim, L.index_dim,
                  row_ptr(L.index_k, L.index_elem, slot, L.index_dim));
    }
}

void kv_read_slot_cpu(const KvLayerView& L, int64_t slot, float* ckv, float* kpe, float* index_k) {
  FP4MOE_CHECK(slot >= 0 && slot < L.num_pages * L.page_size, "kv_read_slot_cpu: slot {} outside the pool of {}",
               slot, L.num_pages * L.page_size);
  if (ckv) kv_decode(L.elem, L.ckv_scale, L.ckv, slot * L.ckv_dim, L.ckv_dim, ckv);
  if (kpe) kv_decode(L.elem, L.kpe_scale, L.kpe, slot * L.kpe_dim, L.kpe_dim, kpe);
  if (index_k) {
    FP4MOE_CHECK(L.index_k, "kv_read_slot_cpu: the layer has no index_k array");
    kv_decode(L.index_elem, L.index_scale, L.index_k, slot * L.index_dim, L.index_dim, index_k);
  }
}

}  // namespace fp4moe::cpu
