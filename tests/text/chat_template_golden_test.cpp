// Chat templates and Jinja probes against jinja2 as transformers runs it
// (tests/text/data/templates/{probes,goldens}.json from tools/text/make_template_goldens.py):
// byte-for-byte output where jinja2 renders, an error where jinja2 fails.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/error.hpp"
#include "text/chat_template.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"
#include "text/text_test_util.hpp"

namespace fp4moe::text {
namespace {

using testing::data_dir;
using testing::read_file;
using testing::read_json;

std::string templates_dir() { return data_dir() + "/templates"; }

// Renders a probe; returns false (and the message) on an error.
bool render_probe(const std::string& source, const nlohmann::ordered_json& context, std::string* out) {
  try {
    const jinja::Template tpl = jinja::parse_template(source);
    std::vector<std::pair<std::string, jinja::Value>> ctx;
    for (auto it = context.begin(); it != context.end(); ++it) ctx.emplace_back(it.key(), jinja::Value::data(it.value()));
    *out = jinja::render(tpl, ctx);
    return true;
  } catch (const jinja::TemplateError& e) {
    *out = e.message;
    return false;
  }
}

TEST(ChatTemplateGolden, ProbesMatchJinja2ByteForByte) {
  const auto doc = read_json(templates_dir() + "/probes.json");
  ASSERT_GE(doc.at("probes").size(), 100u);
  for (const auto& p : doc.at("probes")) {
    std::string out;
    const bool ok = render_probe(p.at("template").get<std::string>(), doc.at("context"), &out);
    const std::string name = p.at("name").get<std::string>();
    if (p.contains("output")) {
      EXPECT_TRUE(ok) << name << ": unexpected error: " << out;
      if (ok) {
        EXPECT_EQ(out, p.at("output").get<std::string>()) << name;
      }
    } else {
      EXPECT_FALSE(ok) << name << ": jinja2 fails (" << p.at("error").get<std::string>() << ") but we rendered: " << out;
      if (!ok) {
        EXPECT_EQ(out.find('\n'), std::string::npos) << name << ": multi-line error: " << out;
      }
    }
  }
}

TEST(ChatTemplateGolden, ChatTemplatesMatchTransformersByteForByte) {
  const auto doc = read_json(templates_dir() + "/goldens.json");
  std::vector<std::pair<std::string, std::string>> specials;
  for (auto it = doc.at("special_tokens").begin(); it != doc.at("special_tokens").end(); ++it)
    specials.emplace_back(it.key(), it.value().get<std::string>());
  ASSERT_GE(doc.at("cases").size(), 150u);
  int rendered = 0, failed = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string file = c.at("template").get<std::string>();
    const std::string what = file + " / " + c.at("conversation").get<std::string>() +
                             (c.at("add_generation_prompt").get<bool>() ? " +gen" : "") + " " + c.at("extra").dump() +
                             (c.at("tools").get<bool>() ? " +tools" : "");
    const ChatTemplate tmpl(read_file(templates_dir() + "/" + file), file, specials);
    ChatTemplateOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    opt.extra = c.at("extra");
    if (c.at("tools").get<bool>()) opt.tools = doc.at("tools");
    const auto& messages = doc.at("conversations").at(c.at("conversation").get<std::string>());
    if (c.contains("output")) {
      try {
        EXPECT_EQ(tmpl.render(messages, opt), c.at("output").get<std::string>()) << what;
        ++rendered;
      } catch (const Error& e) {
        ADD_FAILURE() << what << ": unexpected error: " << e.what();
      }
    } else {
      EXPECT_THROW(tmpl.render(messages, opt), Error) << what << " should fail like jinja2: " << c.at("error");
      ++failed;
    }
  }
  EXPECT_GT(rendered, 100);
  EXPECT_GT(failed, 5);
}

// Issue 41: tool-calling templates in the manner of GLM-4.7/5 and DeepSeek-V3.1 (macros with
// defaults, namespace(), loop.*, tojson(ensure_ascii=False / indent), type tests, str and dict
// methods, slices, `in`, whitespace control) on 60 conversations, each with its own 2-5 tools,
// tool calls with dict and string arguments (nested JSON, unicode), tool results, reasoning
// history, and enable_thinking / clear_thinking / thinking as chat_template_kwargs.
TEST(ChatTemplateGolden, AgenticTemplatesMatchTransformersByteForByte) {
  const std::string dir = templates_dir() + "/agentic";
  const auto doc = read_json(dir + "/goldens.json");
  std::vector<std::pair<std::string, std::string>> specials;
  for (auto it = doc.at("special_tokens").begin(); it != doc.at("special_tokens").end(); ++it)
    specials.emplace_back(it.key(), it.value().get<std::string>());
  ASSERT_GE(doc.at("conversations").size(), 50u);
  std::map<std::string, ChatTemplate> templates;
  std::set<std::string> conversations;
  int rendered = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string file = c.at("template").get<std::string>();
    if (!templates.count(file)) templates.emplace(file, ChatTemplate(read_file(dir + "/" + file), file, specials));
    const auto& conv = doc.at("conversations").at(c.at("conversation").get<std::string>());
    ChatTemplateOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    opt.tools = conv.at("tools");
    opt.extra = c.at("extra");
    const std::string what = file + " / " + c.at("conversation").get<std::string>() + " " + c.at("extra").dump();
    ASSERT_TRUE(c.contains("output")) << what << ": the oracle failed: " << c.at("error");
    try {
      EXPECT_EQ(templates.at(file).render(conv.at("messages"), opt), c.at("output").get<std::string>()) << what;
      ++rendered;
      conversations.insert(c.at("conversation").get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": unexpected error: " << e.what();
    }
  }
  EXPECT_EQ(templates.size(), 2u);
  EXPECT_GE(conversations.size(), 50u);
  EXPECT_GE(rendered, 200);
}

}  // namespace
}  // namespace fp4moe::text
