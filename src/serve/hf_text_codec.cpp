// TextCodec over text/: a model folder's tokenizer.json, generation_config.json and chat
// template (text::Tokenizer, text::StreamingDetokenizer, text::ChatTemplate).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.hpp"
#include "serve/text_codec.hpp"
#include "text/chat_template.hpp"
#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::serve {
namespace {

nlohmann::json read_json_skipping(const std::filesystem::path& path, std::initializer_list<const char*> skip) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  std::stringstream ss;
  ss << in.rdbuf();
  // Drop the big tables (vocab, merges) while parsing: only the pipeline's settings are read.
  try {
    return nlohmann::json::parse(ss.str(), [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
      if (ev == nlohmann::json::parse_event_t::key && depth == 2)
        for (const char* k : skip)
          if (v == k) return false;
      return true;
    }, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
}

// Does any object in v have "lstrip" or "rstrip" true (added tokens that swallow whitespace)?
bool strips_whitespace(const nlohmann::json& v) {
  if (v.is_object()) {
    if (v.value("lstrip", false) == true || v.value("rstrip", false) == true) return true;
    for (const auto& [k, x] : v.items())
      if (strips_whitespace(x)) return true;
  } else if (v.is_array()) {
    for (const auto& x : v)
      if (strips_whitespace(x)) return true;
  }
  return false;
}

// Does v hold an object {"type": type} anywhere?
bool has_type(const nlohmann::json& v, const char* type) {
  if (v.is_object()) {
    if (v.value("type", "") == type) return true;
    for (const auto& [k, x] : v.items())
      if (has_type(x, type)) return true;
  } else if (v.is_array()) {
    for (const auto& x : v)
      if (has_type(x, type)) return true;
  }
  return false;
}

// GPT-2's byte-level alphabet: the character byte b stands for, as UTF-8.
std::string byte_level_char(int b) {
  int n = 0, cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

// Does a pre-tokenizer (or a Sequence of them) remove the text it matches?
bool removes_text(const nlohmann::json& v) {
  if (v.is_object()) {
    if (v.value("behavior", "") == "Removed") return true;
    for (const auto& [k, x] : v.items())
      if (removes_text(x)) return true;
  } else if (v.is_array()) {
    for (const auto& x : v)
      if (removes_text(x)) return true;
  }
  return false;
}

// The bytes of input one token can stand for (text_codec.hpp), or 0. Encoding (text/) repairs
// invalid UTF-8 (each bad byte becomes 3 bytes of U+FFFD: more text, never less), may add a
// prefix space, normalizes, splits and runs BPE, whose tokens concatenate to the pre-tokenized
// text: every id covers exactly its own bytes (token_bytes; an added token matches its
// content; an unknown character, at most 4 bytes, becomes one unk id — without an unk token
// it is dropped, so then every byte must be in the byte-level vocabulary). So without a step
// that shrinks or drops text, ids >= bytes / max(token bytes, 4).
size_t byte_bound(const text::Tokenizer& tok, const std::string& dir) {
  namespace fs = std::filesystem;
  const nlohmann::json tj = read_json_skipping(fs::path(dir) / "tokenizer.json", {"vocab", "merges"});
  if (!tj.is_object()) return 0;
  const nlohmann::json& norm = tj.value("normalizer", nlohmann::json());
  // Unicode normalization can shrink text (NFC maps the 3-byte Kelvin sign to 'K').
  if (!norm.is_null() && !(norm.value("type", "") == "Sequence" && norm.value("normalizers", nlohmann::json::array()).empty()))
    return 0;
  if (removes_text(tj.value("pre_tokenizer", nlohmann::json()))) return 0;
  const nlohmann::json& model = tj.value("model", nlohmann::json::object());
  const nlohmann::json& unk = model.value("unk_token", nlohmann::json());
  const bool has_unk = unk.is_string() && tok.token_to_id(unk.get<std::string>()) >= 0;
  if (has_unk && model.value("fuse_unk", false) == true) return 0;
  if (!has_unk) {  // a character (or byte) outside the vocabulary is dropped: every byte must have its id
    if (!has_type(tj.value("pre_tokenizer", nlohmann::json()), "ByteLevel")) return 0;
    for (int b = 0; b < 256; ++b)
      if (tok.token_to_id(byte_level_char(b)) < 0) return 0;
  }
  if (strips_whitespace(tj.value("added_tokens", nlohmann::json()))) return 0;
  const nlohmann::json cfg = read_json_skipping(fs::path(dir) / "tokenizer_config.json", {});
  if (strips_whitespace(cfg)) return 0;
  size_t longest = 4;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    longest = std::max(longest, tok.token_bytes(id).size());
    if (auto s = tok.id_to_token(id)) longest = std::max(longest, s->size());
  }
  return longest;
}

class HfStreamDecoder : public StreamDecoder {
 public:
  HfStreamDecoder(const text::Tokenizer& tok, bool skip_special) : detok_(tok, skip_special) {}
  std::string push(int32_t id) override { return detok_.push(id); }
  std::string flush() override { return detok_.finish(); }

 private:
  text::StreamingDetokenizer detok_;
};

class HfTextCodec : public TextCodec {
 public:
  explicit HfTextCodec(const std::string& dir) : tok_(text::Tokenizer::from_dir(dir)) {
    if (tok_.chat_template()) tmpl_.emplace(text::ChatTemplate::from_tokenizer(tok_, dir + ": chat template"));
    max_bytes_per_token_ = byte_bound(tok_, dir);
  }
  std::string name() const override { return tok_.summary(); }
  int32_t vocab_size() const override { return tok_.vocab_size(); }
  std::vector<int32_t> eos_ids() const override { return tok_.stop_ids(); }
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    return tok_.encode(text, add_special_tokens);
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    return tok_.decode(ids, skip_special);
  }
  std::string token_text(int32_t id) const override { return std::string(tok_.token_bytes(id)); }
  bool is_special(int32_t id) const override { return tok_.is_special(id); }
  std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special) const override {
    return std::make_unique<HfStreamDecoder>(tok_, skip_special);
  }
  bool has_chat_template() const override { return tmpl_.has_value(); }
  std::string render_chat(const ChatInput& chat) const override {
    FP4MOE_CHECK(tmpl_, "the model folder has no chat template: use /v1/completions");
    text::ChatTemplateOptions opt;
    opt.add_generation_prompt = chat.add_generation_prompt;
    opt.tools = chat.tools;
    opt.extra = chat.kwargs;
    return tmpl_->render(chat.messages, opt);
  }
  size_t max_bytes_per_token() const override { return max_bytes_per_token_; }

 private:
  text::Tokenizer tok_;
  size_t max_bytes_per_token_ = 0;
  std::optional<text::ChatTemplate> tmpl_;
};

}  // namespace

std::unique_ptr<TextCodec> make_hf_text_codec(const std::string& dir) {
  FP4MOE_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"), "{}: no tokenizer.json", dir);
  return std::make_unique<HfTextCodec>(dir);
}

}  // namespace fp4moe::serve
