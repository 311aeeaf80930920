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
