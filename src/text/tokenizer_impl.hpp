// Internal state of a Tokenizer (text/ only): the pipeline parts and the tables derived
// from them once at load.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "text/added_vocab.hpp"
#include "text/bpe.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::text {

// One TemplateProcessing "single" template: the sequence, or a special token's ids.
struct TemplatePiece {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

enum class DecoderKind { None, ByteLevel };

struct TokenizerImpl {
  uint64_t uid = 0;  // keys this tokenizer's per-thread word cache
  std::string origin;
  std::unique_ptr<BpeModel> model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  AddedVocabulary added;
  std::vector<std::vector<TemplatePiece>> post_templates;  // applied in order
  bool has_post_processor = false;
  DecoderKind decoder = DecoderKind::None;

  // Derived by finalize(), indexed by id.
  std::vector<std::string> decoded;     // bytes the decoder turns the token into
  std::vector<uint8_t> known, special;  // id exists; skipped by skip_special_tokens
  int32_t vocab_size = 0;

  // tokenizer_config.json / generation_config.json / chat template.
  std::vector<NamedToken> named;
  std::optional<bool> add_bos, add_eos;
  std::vector<int32_t> stop_ids;
  std::optional<std::string> chat_template;

  void finalize();
  int32_t token_to_id(std::string_view token) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  void encode_words(std::string_view text, std::vector<int32_t>& ids) const;
};

// tokenizer.json → the pipeline (throws Error naming the component at fault).
std::unique_ptr<TokenizerImpl> load_tokenizer_json(std::string_view json, std::string_view origin);
// Reads tokenizer_config.json, generation_config.json and chat_template.jinja of dir into impl.
void load_model_folder_configs(TokenizerImpl& impl, const std::string& dir);

}  // namespace fp4moe::text
