#include "text/chat_template.hpp"

#include "core/error.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::text {

ChatTemplate::ChatTemplate(const std::string& source, std::string origin,
                           std::vector<std::pair<std::string, std::string>> special_tokens)
    : origin_(std::move(origin)), special_tokens_(std::move(special_tokens)) {
  try {
    tpl_ = std::make_unique<jinja::Template>(jinja::parse_template(source));
  } catch (const jinja::TemplateError& e) {
    FP4MOE_FAIL("{}: {}", origin_, e.message);
  }
}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tokenizer, const std::string& origin) {
  const auto& source = tokenizer.chat_template();
  FP4MOE_CHECK(source.has_value(),
               "{}: the model folder has no chat template (no chat_template.jinja and no chat_template in "
               "tokenizer_config.json)",
               origin);
  std::vector<std::pair<std::string, std::string>> specials;
  for (const NamedToken& t : tokenizer.named_tokens()) specials.emplace_back(t.name, t.content);
  return ChatTemplate(*source, origin, std::move(specials));
}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options) const {
  using jinja::Value;
  FP4MOE_CHECK(messages.is_array(), "{}: messages must be a list", origin_);
  FP4MOE_CHECK(!messages.empty(), "{}: cannot apply a chat template to an empty conversation", origin_);
  FP4MOE_CHECK(options.extra.is_null() || options.extra.is_object(), "{}: extra template variables must be an object",
               origin_);
  // What transformers passes: the special tokens, then messages / tools / documents /
  // add_generation_prompt, then the caller's extra variables (which win).
  std::vector<std::pair<std::string, Value>> context;
  for (const auto& [k, v] : special_tokens_) context.emplace_back(k, Value::string(v));
  context.emplace_back("messages", Value::data(messages));
  context.emplace_back("tools", Value::data(options.tools));
  context.emplace_back("documents", Value::data(options.documents));
  context.emplace_back("add_generation_prompt", Value::boolean(options.add_generation_prompt));
  if (options.extra.is_object())
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it)
      context.emplace_back(it.key(), Value::data(it.value()));
  try {
    return jinja::render(*tpl_, context);
  } catch (const jinja::TemplateError& e) {
    FP4MOE_FAIL("{}: {}", origin_, e.message);
  }
}

}  // namespace fp4moe::text
