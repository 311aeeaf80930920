// TextCodec over text/: a model folder's tokenizer.json, generation_config.json and chat
// template (text::Tokenizer, text::StreamingDetokenizer, text::ChatTemplate).
#include <filesystem>
#include <optional>

#include "core/error.hpp"
#include "serve/text_codec.hpp"
#include "text/chat_template.hpp"
#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::serve {
namespace {

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
  std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special) const override {
    return std::make_unique<HfStreamDecoder>(tok_, skip_special);
  }
  bool has_chat_template() const override { return tmpl_.has_value(); }
  std::string render_chat(const nlohmann::json& messages, bool add_generation_prompt) const override {
    FP4MOE_CHECK(tmpl_, "the model folder has no chat template: use /v1/completions");
    text::ChatTemplateOptions opt;
    opt.add_generation_prompt = add_generation_prompt;
    return tmpl_->render(nlohmann::ordered_json::parse(messages.dump()), opt);
  }

 private:
  text::Tokenizer tok_;
  std::optional<text::ChatTemplate> tmpl_;
};

}  // namespace

std::unique_ptr<TextCodec> make_hf_text_codec(const std::string& dir) {
  FP4MOE_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"), "{}: no tokenizer.json", dir);
  return std::make_unique<HfTextCodec>(dir);
}

}  // namespace fp4moe::serve
