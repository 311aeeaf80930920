// Tokenizer: a Hugging Face tokenizer.json (byte-level BPE) in C++, plus what
// transformers reads next to it (tokenizer_config.json, generation_config.json).
//
//   auto tok = fp4moe::text::Tokenizer::from_dir("/models/GLM-5");
//   std::vector<int32_t> ids = tok.encode("Hello", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// encode() gives the ids that tokenizers' Tokenizer.encode gives (and, for from_dir, what
// transformers' tokenizer(text) gives); input that is not valid UTF-8 is first repaired
// (each maximal ill-formed subpart becomes U+FFFD, as Python's errors="replace"). A
// component outside the supported set (see README.md) is a load error naming it.
// All const methods are safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::text {

struct TokenizerImpl;

// A named special token of tokenizer_config.json ("bos_token", ...): its text and id.
struct NamedToken {
  std::string name;     // "bos_token", "eos_token", "unk_token", "pad_token", ...
  std::string content;  // "<|endoftext|>"
  int32_t id = -1;      // -1 when the text is not a token of this tokenizer
};

class Tokenizer {
 public:
  // tokenizer.json (+ tokenizer_config.json, generation_config.json and chat_template.jinja
  // when present) of a model folder. Applies transformers' rules: add_bos_token /
  // add_eos_token in tokenizer_config.json replace the post-processor, and named special
  // tokens missing from the added tokens are added as special tokens.
  static Tokenizer from_dir(const std::string& dir);
  // A tokenizer.json document alone, with the semantics of tokenizers' Tokenizer.from_str.
  // `origin` names it in errors.
  static Tokenizer from_json(std::string_view json, std::string_view origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t token_to_id(std::string_view token) const;           // -1 when absent
  std::optional<std::string> id_to_token(int32_t id) const;     // the token's string
  bool is_special(int32_t id) const;                           // skipped by skip_special_tokens
  int32_t vocab_size() const;                                  // largest id + 1

  // The bytes `id` contributes to a decoded text before UTF-8 repair (the streaming
  // detokenizer's unit); empty for an unknown id. has_space_separator(): the tokenizer has
  // no decoder, so decoded tokens are joined with single spaces (tokenizers' fallback).
  std::string_view token_bytes(int32_t id) const;
  bool has_space_separator() const;

  // ---- what tokenizer_config.json / generation_config.json say ----
  const std::vector<NamedToken>& named_tokens() const;
  const NamedToken* named_token(std::string_view name) const;  // "bos_token", ...; nullptr if unset
  std::optional<bool> add_bos_token() const;
  std::optional<bool> add_eos_token() const;
  // The ids generation stops on: generation_config.json's eos_token_id (int or list), then
  // tokenizer_config.json's eos_token when not already listed.
  const std::vector<int32_t>& stop_ids() const;
  // The chat template (chat_template.jinja, else tokenizer_config.json's chat_template:
  // a string, or the "default" entry of a list); nullopt when the folder has none.
  const std::optional<std::string>& chat_template() const;

  // One line describing what was loaded (for start-up logs).
  std::string summary() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

}  // namespace fp4moe::text
