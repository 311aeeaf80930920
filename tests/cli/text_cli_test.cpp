// End-to-end tests of `fp4moe tokenize`, `detokenize` and `chat-template` on the test
// tokenizer folders: JSON out, ids equal to the goldens, one-line errors with exit 1.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/cli_run_helpers.hpp"

namespace fp4moe::testing_cli {
namespace {

using nlohmann::ordered_json;

std::string data(const std::string& name) { return std::string(FP4MOE_SOURCE_DIR) + "/tests/text/data/" + name; }

ordered_json golden_case(const std::string& folder, const std::string& name) {
  const auto g = ordered_json::parse(slurp(data(folder) + "/goldens.json"));
  for (const auto& c : g.at("cases"))
    if (c.at("name") == name) return c;
  throw std::runtime_error("no golden case " + name);
}

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

TEST(TextCli, TokenizeThenDetokenizeMatchesGoldens) {
  TempDir tmp("text_cli");
  const auto c = golden_case("deepseek_style", "mixed_scripts");
  write(tmp.path / "in.txt", c.at("text").get<std::string>());
  Result r = run_binary(tmp.path, "tokenize " + data("deepseek_style") + " --input " + (tmp.path / "in.txt").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto ids = ordered_json::parse(r.out).at("ids");
  EXPECT_EQ(ids, c.at("hf_ids"));  // with the BOS that tokenizer_config.json asks for

  write(tmp.path / "ids.json", ordered_json{{"ids", ids}}.dump());
  r = run_binary(tmp.path, "detokenize " + data("deepseek_style") + " --skip-special-tokens --input " +
                               (tmp.path / "ids.json").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(ordered_json::parse(r.out).at("text"), c.at("text"));
}

TEST(TextCli, ChatTemplateRendersTheFolderTemplate) {
  TempDir tmp("text_cli");
  const auto g = ordered_json::parse(slurp(data("glm_style") + "/goldens.json")).at("hf_chat");
  write(tmp.path / "chat.json", g.at("messages").dump());
  const Result r = run_binary(tmp.path, "chat-template " + data("glm_style") + " --add-generation-prompt --input " +
                                            (tmp.path / "chat.json").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto out = ordered_json::parse(r.out);
  EXPECT_EQ(out.at("prompt"), g.at("prompt"));
  EXPECT_EQ(out.at("ids"), g.at("ids"));
}

TEST(TextCli, ChatTemplatePassesToolsAndExtraVariables) {
  TempDir tmp("text_cli");
  write(tmp.path / "chat.json",
        R"({"messages": [{"role": "user", "content": "hi"}], "enable_thinking": false, "add_generation_prompt": true,
            "tools": [{"type": "function", "function": {"name": "f"}}]})");
  const Result r = run_binary(tmp.path, "chat-template " + data("glm_style") + " --input " + (tmp.path / "chat.json").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string prompt = ordered_json::parse(r.out).at("prompt");
  EXPECT_NE(prompt.find("{\"type\": \"function\", \"function\": {\"name\": \"f\"}}"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("hi/nothink"), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("<|assistant|>\n<think></think>")) << prompt;
}

// Issue 41 item 6: --tools FILE and --kwargs JSON give the template what a request's tools
// and chat_template_kwargs give it: the same prompt as the input-object form and as the
// library renders with ChatTemplateOptions{tools, extra}.
TEST(TextCli, ChatTemplateToolsAndKwargsFlags) {
  TempDir tmp("text_cli");
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "description": "天气",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  write(tmp.path / "tools.json", tools);
  write(tmp.path / "chat.json", R"([{"role": "user", "content": "hi"}])");
  write(tmp.path / "obj.json", R"({"messages": [{"role": "user", "content": "hi"}], "enable_thinking": false,
      "tools": )" + tools + "}");
  const std::string dir = data("glm_style");
  const Result flags = run_binary(tmp.path, "chat-template " + dir + " --add-generation-prompt --tools " +
                                                (tmp.path / "tools.json").string() +
                                                " --kwargs '{\"enable_thinking\": false}' --input " +
                                                (tmp.path / "chat.json").string());
  ASSERT_EQ(flags.rc, 0) << flags.err;
  const Result obj = run_binary(
      tmp.path, "chat-template " + dir + " --add-generation-prompt --input " + (tmp.path / "obj.json").string());
  ASSERT_EQ(obj.rc, 0) << obj.err;
  const std::string prompt = ordered_json::parse(flags.out).at("prompt");
  EXPECT_EQ(prompt, ordered_json::parse(obj.out).at("prompt").get<std::string>());
  EXPECT_NE(prompt.find(R"("name": "get_weather", "description": "天气")"), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("hi/nothink<|assistant|>\n<think></think>")) << prompt;
  // --kwargs wins over a variable of the input object.
  const Result over = run_binary(tmp.path, "chat-template " + dir + " --kwargs '{\"enable_thinking\": true}' --input " +
                                               (tmp.path / "obj.json").string());
  ASSERT_EQ(over.rc, 0) << over.err;
  EXPECT_EQ(ordered_json::parse(over.out).at("prompt").get<std::string>().find("/nothink"), std::string::npos);
}

TEST(TextCli, ChatTemplateBadToolsAndKwargsAreOneLineErrors) {
  TempDir tmp("text_cli");
  write(tmp.path / "chat.json", R"([{"role": "user", "content": "hi"}])");
  write(tmp.path / "obj.json", R"({"messages": [{"role": "user", "content": "hi"}], "tools": []})");
  write(tmp.path / "bad.json", "[{\"type\": ");
  write(tmp.path / "dict.json", R"({"type": "function"})");
  write(tmp.path / "list.json", R"([1])");
  write(tmp.path / "tools.json", R"([])");
  const std::string base = "chat-template " + data("glm_style") + " --input " + (tmp.path / "chat.json").string();
  const std::pair<std::string, std::string> cases[] = {
      {base + " --tools " + (tmp.path / "bad.json").string(), "bad.json: not valid JSON"},
      {base + " --tools " + (tmp.path / "dict.json").string(), "must be a JSON list of tools, not object"},
      {base + " --tools " + (tmp.path / "list.json").string(), "tool 0 must be an object, not number"},
      {base + " --tools " + (tmp.path / "missing.json").string(), "missing.json: cannot open"},
      {base + " --kwargs '{\"enable_thinking\": '", "--kwargs: not valid JSON"},
      {base + " --kwargs '[1]'", "--kwargs: must be a JSON object of template variables, not array"},
      {base + " --kwargs '{\"tools\": []}'", "'tools' is not a template keyword argument here (give it with --tools)"},
      {base + " --kwargs '{\"messages\": []}'", "'messages' is not a template keyword argument here"},
      {"chat-template " + data("glm_style") + " --input " + (tmp.path / "obj.json").string() + " --tools " +
           (tmp.path / "tools.json").string(),
       "tools given twice"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = run_binary(tmp.path, args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": one line: " << r.err;
  }
}

// Issue 37 item 4 through the CLI: a model folder whose template allocates without bound or
// writes 60 MB ends in one line and exit 1, not in GiBs of memory.
TEST(TextCli, ChatTemplateHostileTemplateIsBounded) {
  TempDir tmp("text_cli");
  write(tmp.path / "chat.json", R"([{"role": "user", "content": "hi"}])");
  const std::pair<std::string, std::string> cases[] = {
      {"{% set a=[0]*1000000 %}{% set b=[a]*60000 %}{{b|length}}", "more than 64 MiB of memory"},
      {"{{ 'x' * 60000000 }}", "output exceeds 4 MiB"},
  };
  for (const auto& [tmpl, want] : cases) {
    const fs::path dir = tmp.path / "model";
    fs::create_directories(dir);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      fs::copy_file(data("glm_style") + "/" + f, dir / f, fs::copy_options::overwrite_existing);
    write(dir / "chat_template.jinja", tmpl);
    const Result r =
        run_binary(tmp.path, "chat-template " + dir.string() + " --input " + (tmp.path / "chat.json").string());
    EXPECT_EQ(r.rc, 1) << tmpl;
    EXPECT_NE(r.err.find(want), std::string::npos) << tmpl << ": " << r.err;
    EXPECT_NE(r.err.find("model: chat template: line 1: "), std::string::npos) << r.err;
  }
}

TEST(TextCli, BadInputsAreOneLineErrors) {
  TempDir tmp("text_cli");
  write(tmp.path / "bad.json", "[1, 2,");
  write(tmp.path / "big.json", "[99999999]");
  write(tmp.path / "chat.json", R"([{"role": "user", "content": "hi"}])");
  const std::pair<std::string, std::string> cases[] = {
      {"detokenize " + data("glm_style") + " --input " + (tmp.path / "bad.json").string(), "not valid JSON"},
      {"detokenize " + data("glm_style") + " --input " + (tmp.path / "big.json").string(), "outside the vocabulary"},
      {"chat-template " + data("gpt2_digits") + " --input " + (tmp.path / "chat.json").string(), "no chat template"},
      {"tokenize " + tmp.path.string(), "no tokenizer.json"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = run_binary(tmp.path, args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find("fp4moe: "), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace fp4moe::testing_cli
