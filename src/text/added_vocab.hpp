// Added tokens (tokenizer.json "added_tokens"): matched in the text before BPE, the way
// Hugging Face tokenizers' AddedVocabulary does it: leftmost-longest matching over the raw
// text for tokens with normalized=false, then over the normalized text for the others;
// single_word drops a match glued to word characters; lstrip / rstrip swallow the
// whitespace to the left / right of a match.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/bpe.hpp"
#include "text/pre_tokenizer.hpp"

namespace fp4moe::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

class AddedVocabulary {
 public:
  // Adds tokens the way tokenizers' add_tokens does: the id is the token's existing id (an
  // earlier added token, else the model vocabulary), else the next free id after the
  // model's vocabulary size. Returns the ids given, in order (-1 for an empty content).
  std::vector<int32_t> add(const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer& normalizer);

  // emit(piece, id): the text cut at matches of the raw (normalized = false) or normalized
  // tokens; id is the added token's id for a match and -1 for the text between matches.
  // Empty pieces are not emitted.
  void split(std::string_view text, bool normalized_set, FunctionRef<void(std::string_view, int32_t)> emit) const;

  int32_t token_to_id(std::string_view content) const;  // -1 when not an added token
  const AddedToken* by_id(int32_t id) const;
  // The string the decoder sees for an added token: its normalized form when normalization
  // changes it (tokenizers >= 0.23), else its content.
  const std::string* decode_string(int32_t id) const;
  bool is_special_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, uint32_t>> next;  // sorted by byte
      int32_t token = -1;                                    // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    bool first[256] = {};
    void insert(std::string_view s, int32_t token);
    void clear() { *this = Trie{}; }
    // Longest token starting at s[i]: its index and end, or -1.
    int32_t longest_at(std::string_view s, size_t i, size_t* end) const;
  };
  void rebuild();

  std::vector<AddedToken> tokens_;  // one per id, in the order first added
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> content_to_id_;
  std::unordered_map<int32_t, std::string> normalized_form_;
  std::vector<std::string> special_contents_;
  Trie raw_, normalized_;
};

}  // namespace fp4moe::text
