// The BPE model of tokenizer.json: vocabulary, ranked merges, and the merge loop.
//
// A word (one pre-token) starts as one symbol per byte (byte-level: each byte's GPT-2
// character) or per UTF-8 character; then, as in Hugging Face tokenizers, the adjacent pair
// with the lowest merge rank is merged, the leftmost first among equal ranks, until no
// adjacent pair has a merge. Merge ranks live in an open-addressing table keyed by the
// pair of ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fp4moe::text {

// GPT-2's byte <-> printable character table (ByteLevel pre-tokenizer / decoder).
struct ByteLevelAlphabet {
  char32_t byte_to_char[256];
  std::string byte_to_utf8[256];
  int16_t char_to_byte[512];  // code points used by the table are < 512; -1 elsewhere
  static const ByteLevelAlphabet& get();
  int byte_of(char32_t cp) const { return cp < 512 ? char_to_byte[cp] : -1; }
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // Throws Error naming the merge or token at fault.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string* id_to_token(int32_t id) const;   // nullptr when absent
  size_t vocab_size() const { return vocab_.size(); }  // number of entries (tokenizers' get_vocab_size)
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }
  size_t num_merges() const { return merge_count_; }

  // Appends the ids of one word. byte_level: the word is raw bytes and each byte starts as
  // its GPT-2 character; otherwise each UTF-8 character of the word starts as itself.
  void tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

  // The merge loop alone, on initial symbols (exposed for tests: both strategies must agree).
  void merge_small(std::vector<int32_t>& symbols) const;
  void merge_heap(std::vector<int32_t>& symbols) const;

 private:
  struct Merge {
    uint64_t key;  // (left << 32) | right; kEmpty for a free slot
    uint32_t rank;
    int32_t new_id;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  const Merge* find_merge(int32_t left, int32_t right) const {
    const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> merge_shift_);
    while (true) {
      const Merge& m = merges_[slot];
      if (m.key == key) return &m;
      if (m.key == kEmpty) return nullptr;
      slot = (slot + 1) & merge_mask_;
    }
  }
  void insert_merge(int32_t left, int32_t right, uint32_t rank, int32_t new_id);
  void initial_symbols(std::string_view word, bool byte_level, std::vector<int32_t>& symbols) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_id_;
  std::vector<Merge> merges_;
  size_t merge_mask_ = 0;
  int merge_shift_ = 64;
  size_t merge_count_ = 0;
  int32_t byte_ids_[256];
  int32_t unk_id_ = -1;
  BpeOptions options_;
};

}  // namespace fp4moe::text
