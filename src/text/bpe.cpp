#include "text/bpe.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet table = [] {
    ByteLevelAlphabet t;
    std::fill(std::begin(t.char_to_byte), std::end(t.char_to_byte), int16_t(-1));
    // Printable bytes map to themselves; the others, in byte order, to 256, 257, ...
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? char32_t(b) : char32_t(next++);
      t.byte_to_char[b] = cp;
      append_utf8(t.byte_to_utf8[b], cp);
      t.char_to_byte[cp] = int16_t(b);
    }
    return t;
  }();
  return table;
}

size_t StringHash::operator()(std::string_view s) const noexcept {
  // 64-bit multiply-mix over 8-byte words.
  uint64_t h = 0x243F6A8885A308D3ull ^ (s.size() * 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;  // the tail, without a variable-length memcpy call
  const unsigned char* t = reinterpret_cast<const unsigned char*>(s.data() + i);
  switch (s.size() - i) {
    case 7: w |= uint64_t(t[6]) << 48; [[fallthrough]];
    case 6: w |= uint64_t(t[5]) << 40; [[fallthrough]];
    case 5: w |= uint64_t(t[4]) << 32; [[fallthrough]];
    case 4: w |= uint64_t(t[3]) << 24; [[fallthrough]];
    case 3: w |= uint64_t(t[2]) << 16; [[fallthrough]];
    case 2: w |= uint64_t(t[1]) << 8; [[fallthrough]];
    case 1: w |= uint64_t(t[0]); break;
    default: break;
  }
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return size_t(h);
}

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    FP4MOE_CHECK(id >= 0, "model.vocab: token {:?} has negative id {}", tok, id);
    max_id = std::max(max_id, id);
  }
  FP4MOE_CHECK(max_id < (1 << 24), "model.vocab: id {} is beyond 16M entries", max_id);
  id_to_token_.resize(size_t(max_id + 1));
  has_id_.assign(size_t(max_id + 1), 0);
  for (const auto& [tok, id] : vocab_) {
    FP4MOE_CHECK(!has_id_[size_t(id)], "model.vocab: id {} is given to both {:?} and {:?}", id,
                 id_to_token_[size_t(id)], tok);
    id_to_token_[size_t(id)] = tok;
    has_id_[size_t(id)] = 1;
  }
  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    FP4MOE_CHECK(unk_id_ >= 0, "model.unk_token {:?} is not in the vocabulary", *options_.unk_token);
  }
  const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
  for (int b = 0; b < 256; ++b) byte_ids_[b] = token_to_id(alpha.byte_to_utf8[b]);

  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  merges_.assign(cap, Merge{kEmpty, 0, 0});
  merge_mask_ = cap - 1;
  merge_shift_ = 64 - std::countr_zero(cap);
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int32_t ia = token_to_id(a), ib = token_to_id(b);
    FP4MOE_CHECK(ia >= 0, "model.merges[{}]: {:?} is not in the vocabulary", rank, a);
    FP4MOE_CHECK(ib >= 0, "model.merges[{}]: {:?} is not in the vocabulary", rank, b);
    joined.assign(a).append(b);
    const int32_t merged = token_to_id(joined);
    FP4MOE_CHECK(merged >= 0, "model.merges[{}]: the merged token {:?} is not in the vocabulary", rank, joined);
    insert_merge(ia, ib, uint32_t(rank), merged);  // a repeated pair keeps its last rank, as in tokenizers
  }
}

void BpeModel::insert_merge(int32_t left, int32_t right, uint32_t rank, int32_t new_id) {
  const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> merge_shift_);
  while (merges_[slot].key != kEmpty && merges_[slot].key != key) slot = (slot + 1) & merge_mask_;
  if (merges_[slot].key == kEmpty) ++merge_count_;
  merges_[slot] = Merge{key, rank, new_id};
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_id_[size_t(id)]) return nullptr;
  return &id_to_token_[size_t(id)];
}

void BpeModel::initial_symbols(std::string_view word, bool byte_level, std::vector<int32_t>& symbols) const {
  // Unknown characters become unk (consecutive ones fused with fuse_unk) or are dropped
  // when the model has no unk token, as tokenizers' merge_word does.
  bool last_unk = false;
  const auto push = [&](int32_t id) {
    if (id >= 0) {
      symbols.push_back(id);
      last_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(last_unk && options_.fuse_unk)) symbols.push_back(unk_id_);
      last_unk = true;
    }
  };
  if (byte_level) {
    for (unsigned char b : word) push(byte_ids_[b]);
    return;
  }
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    next_code_point(word, i);
    push(token_to_id(word.substr(start, i - start)));
  }
}

void BpeModel::merge_small(std::vector<int32_t>& s) const {
  // ranks[i]: rank of the merge of (s[i], s[i+1]); new_ids[i]: its result.
  constexpr uint32_t kNone = ~uint32_t(0);
  const size_t n0 = s.size();
  uint32_t ranks_buf[64];
  int32_t new_buf[64];
  std::vector<uint32_t> ranks_vec;
  std::vector<int32_t> new_vec;
  uint32_t* ranks = ranks_buf;
  int32_t* new_ids = new_buf;
  if (n0 > 64) {
    ranks_vec.resize(n0);
    new_vec.resize(n0);
    ranks = ranks_vec.data();
    new_ids = new_vec.data();
  }
  const auto fill = [&](size_t i) {
    const Merge* m = find_merge(s[i], s[i + 1]);
    ranks[i] = m ? m->rank : kNone;
    new_ids[i] = m ? m->new_id : -1;
  };
  size_t n = n0;
  for (size_t i = 0; i + 1 < n; ++i) fill(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == kNone) break;
    s[best] = new_ids[best];
    // Remove symbol best+1 and pair best+1.
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      ranks[i] = ranks[i + 1];
      new_ids[i] = new_ids[i + 1];
    }
    --n;
    if (best + 1 < n) fill(best);
    if (best > 0) fill(best - 1);
  }
  s.resize(n);
}

// Words longer than this (in symbols) do not leave their scratch buffers allocated per thread.
constexpr size_t kLargeWord = size_t(1) << 16;

void BpeModel::merge_heap(std::vector<int32_t>& s) const {
  // Symbols in a linked list; candidate merges in a min-heap of (rank << 32 | position). A
  // popped candidate is stale when its left symbol is gone or the pair there now has another
  // rank (a rank names one pair). Buffers live per thread: long words (CJK runs) are common.
  thread_local std::vector<int32_t> next;
  thread_local std::vector<int32_t> prev;
  thread_local std::vector<uint64_t> heap;
  const size_t n = s.size();
  constexpr int32_t kGone = -2;  // next[] of a symbol merged into its left neighbour
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    if (i + 1 < n)
      if (const Merge* m = find_merge(s[i], s[i + 1])) heap.push_back((uint64_t(m->rank) << 32) | i);
  }
  const auto cmp = std::greater<uint64_t>();
  std::make_heap(heap.begin(), heap.end(), cmp);
  const auto consider = [&](int32_t left) {
    const int32_t right = next[size_t(left)];
    if (right < 0) return;
    if (const Merge* m = find_merge(s[size_t(left)], s[size_t(right)])) {
      heap.push_back((uint64_t(m->rank) << 32) | uint32_t(left));
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const uint64_t top = heap.back();
    heap.pop_back();
    const size_t p = size_t(uint32_t(top));
    const int32_t q = next[p];
    if (q < 0) continue;  // merged away, or the last symbol
    const Merge* m = find_merge(s[p], s[size_t(q)]);
    if (!m || m->rank != uint32_t(top >> 32)) continue;
    s[p] = m->new_id;
    next[p] = next[size_t(q)];
    next[size_t(q)] = kGone;
    if (next[p] >= 0) prev[size_t(next[p])] = int32_t(p);
    if (prev[p] >= 0) consider(prev[p]);
    consider(int32_t(p));
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (next[i] != kGone) s[w++] = s[i];
  s.resize(w);
  if (n > kLargeWord) {  // a huge word's buffers are not kept on this thread
    std::vector<int32_t>().swap(next);
    std::vector<int32_t>().swap(prev);
    std::vector<uint64_t>().swap(heap);
  }
}

// Up to this many symbols the quadratic scan (no heap, no lists) is faster.
constexpr size_t kSmallWord = 32;

void BpeModel::tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (byte_level && word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (options_.ignore_merges) {
    std::string mapped;
    if (byte_level) {
      const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
      for (unsigned char b : word) mapped += alpha.byte_to_utf8[b];
    }
    const int32_t id = token_to_id(byte_level ? std::string_view(mapped) : word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  initial_symbols(word, byte_level, symbols);
  if (symbols.size() <= kSmallWord)
    merge_small(symbols);
  else
    merge_heap(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (symbols.capacity() > kLargeWord) std::vector<int32_t>().swap(symbols);
}

}  // namespace fp4moe::text
