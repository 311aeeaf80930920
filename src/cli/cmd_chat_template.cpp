// fp4moe chat-template DIR: a conversation on stdin → {"prompt": ..., "ids": [...]}.
//
// Input: a JSON list of messages, or an object {"messages": [...], "tools": [...],
// "documents": [...], "add_generation_prompt": bool, <other template variables, e.g.
// "enable_thinking": false>}. The prompt is rendered with the folder's chat template the
// way transformers' apply_chat_template does, and tokenized without adding special tokens.
#include <memory>
#include <string>

#include "cli/command.hpp"
#include "cli/text_io.hpp"
#include "text/chat_template.hpp"

namespace fp4moe {
namespace {

struct ChatTemplateArgs {
  std::string dir, input = "-";
  bool add_generation_prompt = false;
};

int run_chat_template(const ChatTemplateArgs& a) {
  const text::Tokenizer tok = cli::load_tokenizer(a.dir);
  const auto in = cli::parse_input_json(cli::read_input(a.input), a.input);
  nlohmann::ordered_json messages;
  text::ChatTemplateOptions opt;
  opt.add_generation_prompt = a.add_generation_prompt;
  if (in.is_array()) {
    messages = in;
  } else {
    FP4MOE_CHECK(in.is_object() && in.contains("messages"),
                 "input must be a list of messages or an object with \"messages\"");
    opt.extra = nlohmann::ordered_json::object();
    for (auto it = in.begin(); it != in.end(); ++it) {
      if (it.key() == "messages") {
        messages = it.value();
      } else if (it.key() == "tools") {
        opt.tools = it.value();
      } else if (it.key() == "documents") {
        opt.documents = it.value();
      } else if (it.key() == "add_generation_prompt") {
        FP4MOE_CHECK(it.value().is_boolean(), "add_generation_prompt must be true or false");
        opt.add_generation_prompt = opt.add_generation_prompt || it.value().get<bool>();
      } else {
        opt.extra[it.key()] = it.value();
      }
    }
  }
  const text::ChatTemplate tmpl = text::ChatTemplate::from_tokenizer(tok, a.dir + ": chat template");
  nlohmann::ordered_json out;
  out["prompt"] = tmpl.render(messages, opt);
  out["ids"] = tok.encode(out["prompt"].get<std::string>(), false);
  cli::print_json(out);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ChatTemplateArgs>();
  app.add_option("dir", a->dir, "model folder with tokenizer.json and a chat template")->required();
  app.add_option("--input", a->input, "read the conversation from this file instead of stdin");
  app.add_flag("--add-generation-prompt", a->add_generation_prompt, "end with the assistant turn's opening");
  run = [a] { return run_chat_template(*a); };
}

const cli::Registrar kRegistrar{"chat-template",
                                "A conversation (JSON) on stdin -> prompt text and ids via the folder's chat template",
                                setup};

}  // namespace
}  // namespace fp4moe
