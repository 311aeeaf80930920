// The byte-level stand-in tokenizer (see text_codec.hpp).
#include <algorithm>
#include <array>

#include "core/error.hpp"
#include "serve/text_codec.hpp"

namespace fp4moe::serve {
namespace {

constexpr int32_t kEos = 256;
const std::array<const char*, 4> kSpecials = {"<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"};

class ByteStreamDecoder : public StreamDecoder {
 public:
  explicit ByteStreamDecoder(bool skip_special) : skip_special_(skip_special) {}
  std::string push(int32_t id) override {
    if (id >= 256) {
      if (skip_special_) return {};
      std::string out = flush();
      return out + kSpecials[size_t(id - 256)];
    }
    held_ += char(uint8_t(id));
    const size_t n = utf8_complete_prefix(held_);
    std::string out = held_.substr(0, n);
    held_.erase(0, n);
    return out;
  }
  std::string flush() override {
    std::string out;
    out.swap(held_);
    return out;
  }

 private:
  bool skip_special_;
  std::string held_;
};

class ByteCodec : public TextCodec {
 public:
  std::string name() const override { return "byte-level stand-in"; }
  int32_t vocab_size() const override { return 256 + int32_t(kSpecials.size()); }
  std::vector<int32_t> eos_ids() const override { return {kEos}; }
  std::vector<int32_t> encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      bool special = false;
      for (size_t s = 0; s < kSpecials.size() && !special; ++s)
        if (text.substr(i).starts_with(kSpecials[s])) {
          ids.push_back(256 + int32_t(s));
          i += std::string_view(kSpecials[s]).size();
          special = true;
        }
      if (!special) ids.push_back(int32_t(uint8_t(text[i++])));
    }
    return ids;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      FP4MOE_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary", id);
      if (id < 256)
        out += char(uint8_t(id));
      else if (!skip_special)
        out += kSpecials[size_t(id - 256)];
    }
    return out;
  }
  std::string token_text(int32_t id) const override {
    FP4MOE_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary", id);
    return id < 256 ? std::string(1, char(uint8_t(id))) : std::string(kSpecials[size_t(id - 256)]);
  }
  bool is_special(int32_t id) const override { return id >= 256; }
  std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special) const override {
    return std::make_unique<ByteStreamDecoder>(skip_special);
  }
  bool has_chat_template() const override { return true; }
  // Tools and template variables go in as a first "<|tools|>" line of JSON, tool calls after
  // their message's content, so tests can see that they reach the template.
  std::string render_chat(const ChatInput& chat) const override {
    std::string out;
    if (!chat.tools.is_null()) out += "<|tools|>\n" + chat.tools.dump() + "\n";
    if (!chat.kwargs.is_null()) out += "<|kwargs|>\n" + chat.kwargs.dump() + "\n";
    for (const auto& m : chat.messages) {
      out += "<|" + m.at("role").get<std::string>() + "|>\n" + m.at("content").get<std::string>() + "\n";
      if (m.contains("tool_calls")) out += m["tool_calls"].dump() + "\n";
    }
    if (chat.add_generation_prompt) out += "<|assistant|>\n";
    return out;
  }
  // A token is one byte or one special string (the longest: "<|assistant|>").
  size_t max_bytes_per_token() const override {
    size_t n = 1;
    for (const char* s : kSpecials) n = std::max(n, std::string_view(s).size());
    return n;
  }
};

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last 3 bytes can start an incomplete sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const uint8_t c = uint8_t(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF8 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;  // the lead byte's sequence is cut: hold it back
  }
  return n;
}

std::unique_ptr<TextCodec> make_byte_codec() { return std::make_unique<ByteCodec>(); }

}  // namespace fp4moe::serve
