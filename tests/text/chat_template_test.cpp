// Chat template behaviour beyond the jinja2 goldens: unsupported constructs are one clear
// error, a folder without a template fails at chat time, hostile templates hit limits, and
// the folder's template + tokenizer give transformers' apply_chat_template prompt and ids.
#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "text/chat_template.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"
#include "text/text_test_util.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::text {
namespace {

using testing::data_dir;
using testing::read_json;

const nlohmann::ordered_json kHello = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");

std::string error_of(const std::string& source) {
  try {
    ChatTemplate t(source, "t.jinja");
    t.render(kHello);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, UnsupportedConstructsAreOneLineErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% include 'x' %}", "the 'include' tag is not supported"},
      {"{% import 'x' as y %}", "the 'import' tag is not supported"},
      {"{% extends 'x' %}", "the 'extends' tag is not supported"},
      {"{% block b %}{% endblock %}", "the 'block' tag is not supported"},
      {"{% call m() %}{% endcall %}", "the 'call' tag is not supported"},
      {"{% filter upper %}x{% endfilter %}", "the 'filter' tag is not supported"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
      {"{{ x | frobnicate }}", "no filter named 'frobnicate'"},
      {"{{ x is frobnicated }}", "no test named 'frobnicated'"},
      {"{{ f(*args) }}", "*args and **kwargs in calls are not supported"},
      {"{{ '%s' % 'x' }}", "printf-style string formatting"},
      {"{{ 'a{}'.format(1) }}", "str.format() is not supported"},
      {"{% do x %}", "the 'do' tag is not supported"},
      {"{% frob %}", "unknown tag 'frob'"},
      {"{{ messages[0] }", "unexpected"},
      {"{% if true %}", "unexpected end of template, expected 'endif'"},
      {"{{ x }}\xf1", "not valid UTF-8"},
  };
  for (const auto& [src, want] : cases) {
    const std::string msg = error_of(src);
    EXPECT_NE(msg.find(want), std::string::npos) << src << " -> " << msg;
    EXPECT_EQ(msg.rfind("t.jinja: line ", 0), 0u) << src << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << src << " -> " << msg;
  }
}

TEST(ChatTemplate, RaiseExceptionMessageReachesTheCaller) {
  const std::string msg = error_of("{{ raise_exception('roles must alternate') }}");
  EXPECT_EQ(msg, "t.jinja: line 1: raise_exception: roles must alternate");
}

std::string render_error(const std::string& source, const jinja::RenderLimits& limits) {
  try {
    jinja::render(jinja::parse_template(source), {}, limits);
  } catch (const jinja::TemplateError& e) {
    return e.message;
  }
  return "";
}

TEST(ChatTemplate, HostileTemplatesHitLimits) {
  jinja::RenderLimits small;
  small.max_steps = 20000;
  small.max_output_bytes = 100000;
  EXPECT_NE(render_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", small)
                .find("more than 20000 steps"),
            std::string::npos);
  EXPECT_NE(render_error("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", small).find("exceeds 100000 bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}").find("nested deeper"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}")
                .find("too large"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(10000000) | length }}").find("1,000,000"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
}

TEST(ChatTemplate, BadConversationsAreErrors) {
  ChatTemplate t("{{ messages | length }}", "t.jinja");
  EXPECT_EQ(t.render(kHello), "1");
  EXPECT_THROW(t.render(nlohmann::ordered_json::array()), Error);
  EXPECT_THROW(t.render(nlohmann::ordered_json::object()), Error);
}

TEST(ChatTemplate, StrftimeNowGivesTheCurrentYear) {
  ChatTemplate t("{{ strftime_now('%Y') }}", "t.jinja");
  const std::string y = t.render(kHello);
  ASSERT_EQ(y.size(), 4u);
  EXPECT_GE(std::stoi(y), 2024);
}

TEST(ChatTemplate, MissingTemplateIsAnErrorAtChatTimeNotAtLoad) {
  const Tokenizer tok = Tokenizer::from_dir(data_dir() + "/gpt2_digits");  // loads fine
  try {
    ChatTemplate::from_tokenizer(tok, "gpt2_digits");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, FolderPromptAndIdsMatchApplyChatTemplate) {
  for (const char* name : {"glm_style", "deepseek_style"}) {
    const std::string dir = data_dir() + "/" + name;
    const auto golden = read_json(dir + "/goldens.json").at("hf_chat");
    const Tokenizer tok = Tokenizer::from_dir(dir);
    const ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
    ChatTemplateOptions opt;
    opt.add_generation_prompt = true;
    const std::string prompt = tmpl.render(golden.at("messages"), opt);
    EXPECT_EQ(prompt, golden.at("prompt").get<std::string>()) << name;
    EXPECT_EQ(tok.encode(prompt, false), golden.at("ids").get<std::vector<int32_t>>()) << name;
  }
}

}  // namespace
}  // namespace fp4moe::text
