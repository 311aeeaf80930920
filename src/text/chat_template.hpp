// Chat templates: render a conversation to the prompt text the way transformers'
// apply_chat_template does (jinja2 ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, raise_exception, strftime_now, loop controls, and tojson as transformers
// defines it), with a C++ Jinja subset interpreter (text/jinja/).
//
//   auto tok = Tokenizer::from_dir(dir);
//   auto tmpl = ChatTemplate::from_tokenizer(tok);      // clear error if the folder has none
//   ChatTemplateOptions opt;
//   opt.add_generation_prompt = true;
//   opt.extra = {{"enable_thinking", false}};
//   std::string prompt = tmpl.render(messages_json, opt);
//   std::vector<int32_t> ids = tok.encode(prompt, /*add_special_tokens=*/false);
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::text {

class Tokenizer;
namespace jinja {
struct Template;
}

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;      // a list of tool schemas, or null (the template sees None)
  nlohmann::ordered_json documents;  // null, or a list of documents
  nlohmann::ordered_json extra;      // an object of extra template variables, e.g. {"enable_thinking": false}
};

class ChatTemplate {
 public:
  // Parses the template. A syntax error or a construct outside the supported subset throws
  // Error("<origin>: line N: ..."). special_tokens: the variables transformers adds
  // ("bos_token" -> "<s>", ...).
  explicit ChatTemplate(const std::string& source, std::string origin = "chat template",
                        std::vector<std::pair<std::string, std::string>> special_tokens = {});
  // The tokenizer folder's template and named special tokens; a folder without a chat
  // template is an error here (not when the tokenizer loads).
  static ChatTemplate from_tokenizer(const Tokenizer& tokenizer, const std::string& origin = "chat template");

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // messages: a non-empty list of {"role": ..., "content": ..., "tool_calls": ...}.
  // Throws Error("<origin>: ...") when rendering fails (raise_exception included).
  std::string render(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options = {}) const;

 private:
  std::unique_ptr<jinja::Template> tpl_;
  std::string origin_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

}  // namespace fp4moe::text
