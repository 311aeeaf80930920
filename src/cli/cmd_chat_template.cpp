// fp4moe chat-template DIR: a conversation on stdin → {"prompt": ..., "ids": [...]}.
//
// Input: a JSON list of messages, or an object {"messages": [...], "tools": [...],
// "documents": [...], "add_generation_prompt": bool, <other template variables, e.g.
// "enable_thinking": false>}. The prompt is rendered with the folder's chat template the
// way transformers' apply_chat_template does, and tokenized without adding special tokens.
// --tools FILE (a JSON list of tool schemas, the template's `tools`) and --kwargs JSON (an
// object of extra template variables, what a request's chat_template_kwargs gives) render
// what the server renders for a request with those fields (the server always adds the
// generation prompt: pass --add-generation-prompt to see its prompt).
#include <memory>
#include <string>

#include "cli/command.hpp"
#include "cli/text_io.hpp"
#include "text/chat_template.hpp"

namespace fp4moe {
namespace {

struct ChatTemplateArgs {
  std::string dir, input = "-", tools_file, kwargs;
  bool add_generation_prompt = false;
};

// --tools FILE: a JSON list of tool objects.
nlohmann::ordered_json read_tools(const std::string& path) {
  auto tools = cli::parse_input_json(cli::read_input(path), path);
  FP4MOE_CHECK(tools.is_array(), "--tools {}: must be a JSON list of tools, not {}", path, tools.type_name());
  for (size_t i = 0; i < tools.size(); ++i)
    FP4MOE_CHECK(tools[i].is_object(), "--tools {}: tool {} must be an object, not {}", path, i, tools[i].type_name());
  return tools;
}

// --kwargs JSON: an object of template variables; the ones the renderer sets itself are refused.
nlohmann::ordered_json parse_kwargs(const std::string& text) {
  nlohmann::ordered_json kw;
  try {
    kw = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL("--kwargs: not valid JSON: {}", e.what());
  }
  FP4MOE_CHECK(kw.is_object(), "--kwargs: must be a JSON object of template variables, not {}", kw.type_name());
  for (const char* k : {"messages", "tools", "documents", "add_generation_prompt"})
    FP4MOE_CHECK(!kw.contains(k), "--kwargs: '{}' is not a template keyword argument here (give it {})", k,
                 std::string(k) == "tools" ? "with --tools" : std::string(k) == "add_generation_prompt"
                                                                     ? "with --add-generation-prompt"
                                                                     : "in the input");
  return kw;
}

int run_chat_template(const ChatTemplateArgs& a) {
  // The flags first: a bad --tools / --kwargs fails before stdin is read.
  nlohmann::ordered_json tools, kwargs;
  if (!a.tools_file.empty()) tools = read_tools(a.tools_file);
  if (!a.kwargs.empty()) kwargs = parse_kwargs(a.kwargs);
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
  if (!tools.is_null()) {
    FP4MOE_CHECK(opt.tools.is_null(), "tools given twice: in the input and with --tools");
    opt.tools = tools;
  }
  if (kwargs.is_object()) {
    if (!opt.extra.is_object()) opt.extra = nlohmann::ordered_json::object();
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) opt.extra[it.key()] = it.value();  // --kwargs wins
  }
  const text::Tokenizer tok = cli::load_tokenizer(a.dir);
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
  app.add_flag("--add-generation-prompt", a->add_generation_prompt,
               "end with the assistant turn's opening (the server always does)");
  app.add_option("--tools", a->tools_file,
                 "a JSON file with the list of tools (OpenAI tool objects), given to the template as `tools`");
  app.add_option("--kwargs", a->kwargs,
                 "a JSON object of extra template variables, as a request's chat_template_kwargs "
                 "(e.g. '{\"enable_thinking\": false}'); they win over the input's");
  run = [a] { return run_chat_template(*a); };
}

const cli::Registrar kRegistrar{"chat-template",
                                "A conversation (JSON) on stdin -> prompt text and ids via the folder's chat template",
                                setup};

}  // namespace
}  // namespace fp4moe
