// What the server needs from the text side: token ids <-> text, a streaming detokenizer,
// the chat template and the EOS ids: a model folder's tokenizer through text/
// (hf_text_codec.cpp), or a byte-level stand-in for the fake backend without a folder.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::serve {

// What the chat template renders: the conversation, the tools and extra template variables.
struct ChatInput {
  // [{"role", "content": string, and where given "name", "tool_calls" (each
  // {"id", "type": "function", "function": {"name", "arguments": object}}), "tool_call_id",
  // "reasoning_content"}], validated; key order as the client sent it.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;   // null, or the client's [{"type": "function", "function": {...}}]
  nlohmann::ordered_json kwargs;  // null, or chat_template_kwargs: an object of extra template variables
  bool add_generation_prompt = true;
};

// Turns generated ids into text as they come, holding back bytes of an incomplete UTF-8
// character (or whatever the tokenizer needs) until the next id completes them.
class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  virtual std::string push(int32_t id) = 0;  // the new text (may be empty)
  virtual std::string flush() = 0;           // what was held back, at the end
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::string name() const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::vector<int32_t> eos_ids() const = 0;
  // Text -> ids; special-token strings in the text become their ids. add_special_tokens: the
  // tokenizer's own additions (BOS ...), as transformers' tokenizer(text) does; a rendered chat
  // template already holds them.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  // Ids -> text; special tokens are left out when skip_special.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;
  // One token's own bytes (for logprobs; may be part of a UTF-8 character).
  virtual std::string token_text(int32_t id) const = 0;
  // A special (control) token: never part of the text a grammar constrains.
  virtual bool is_special(int32_t id) const = 0;
  virtual std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special) const = 0;
  virtual bool has_chat_template() const = 0;
  // Renders a validated conversation (api_request.cpp) into the prompt text: the template sees
  // `messages`, `tools` (None when null), `add_generation_prompt` and chat.kwargs as extra
  // variables; throws fp4moe::Error when the template refuses them (raise_exception).
  virtual std::string render_chat(const ChatInput& chat) const = 0;
  // The most bytes of input text one token can stand for, or 0 when no bound holds (a
  // normalizer that can shrink text, a pre-tokenizer that removes text, added tokens that strip
  // whitespace, fused unknown tokens). A text of B bytes then encodes to at least
  // ceil(B / max_bytes_per_token()) tokens: the server refuses a prompt that cannot fit the
  // context before encoding it.
  virtual size_t max_bytes_per_token() const = 0;
};

// The stand-in: ids 0-255 are bytes, then <|endoftext|> (EOS, 256), <|system|>, <|user|>,
// <|assistant|>. Chat: "<|role|>\n" + content + "\n" per message (and its tool_calls as a JSON
// line), then "<|assistant|>\n"; tools and template variables first as "<|tools|>" / "<|kwargs|>"
// lines of JSON.
std::unique_ptr<TextCodec> make_byte_codec();

// A model folder's tokenizer (tokenizer.json, tokenizer_config.json, generation_config.json,
// chat template) through text/. Throws fp4moe::Error when it cannot be loaded.
std::unique_ptr<TextCodec> make_hf_text_codec(const std::string& dir);

// The longest prefix of s that ends on a UTF-8 character boundary given what may still follow
// (an incomplete trailing sequence is cut off; invalid bytes count as complete).
size_t utf8_complete_prefix(std::string_view s);

}  // namespace fp4moe::serve
