#include <random>

#include <gtest/gtest.h>

#include "serve/api_request_invariants.hpp"
#include "serve/mutate.hpp"

using namespace fp4moe::serve;

namespace {

ApiRequest ok(ApiKind kind, const std::string& body) {
  auto r = parse_api_request(kind, body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::get_if<ApiRequest>(&r) ? std::get<ApiRequest>(r) : ApiRequest{};
}

ApiError bad(ApiKind kind, const std::string& body) {
  auto r = parse_api_request(kind, body);
  if (std::holds_alternative<ApiRequest>(r)) ADD_FAILURE() << body << " was accepted";
  return std::get_if<ApiError>(&r) ? std::get<ApiError>(r) : ApiError{};
}

}  // namespace

TEST(ApiRequest, ChatFieldsBecomeNativeValues) {
  const auto r = ok(ApiKind::kChat, R"({"model": "m", "messages": [{"role": "system", "content": "s"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null}],
    "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
    "presence_penalty": 1, "frequency_penalty": -1, "repetition_penalty": 1.1, "seed": -3, "stop": "x",
    "stop_token_ids": [3, 4], "n": 2, "logprobs": true, "top_logprobs": 4, "stream": true,
    "stream_options": {"include_usage": true}, "ignore_eos": true, "user": "u", "metadata": {"k": "v"}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.chat.messages.size(), 3u);
  EXPECT_EQ(r.chat.messages[1]["content"], "a b");  // text parts joined with " ", as SGLang does
  EXPECT_EQ(r.chat.messages[2]["content"], "");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.sampling.has_seed);
  EXPECT_EQ(r.sampling.seed, uint64_t(int64_t(-3)));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.stop_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.logprobs, 4);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(ApiRequest, PromptsComeInFourForms) {
  EXPECT_EQ(ok(ApiKind::kCompletion, R"({"prompt": "ab"})").prompts[0].text, "ab");
  auto two = ok(ApiKind::kCompletion, R"({"prompt": ["a", "b"]})");
  ASSERT_EQ(two.prompts.size(), 2u);
  EXPECT_EQ(two.prompts[1].text, "b");
  auto ids = ok(ApiKind::kCompletion, R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_ids);
  EXPECT_EQ(ids.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  auto batch = ok(ApiKind::kCompletion, R"({"prompt": [[1], [2, 3]]})");
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(batch.prompts[1].ids.size(), 2u);
  EXPECT_FALSE(ok(ApiKind::kCompletion, R"({"prompt": "a"})").max_tokens.has_value());
}

TEST(ApiRequest, GenerateReadsSamplingParams) {
  auto r = ok(ApiKind::kGenerate, R"({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 9,
    "temperature": 0, "stop": ["a", "b"], "sampling_seed": 4, "n": 3}, "stream": true, "return_logprob": true,
    "top_logprobs_num": 2})");
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_EQ(r.sampling.seed, 4u);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(ok(ApiKind::kGenerate, R"({"text": "a"})").max_tokens, 128);
  EXPECT_EQ(ok(ApiKind::kGenerate, R"({"text": "a"})").logprobs, -1);
}

TEST(ApiRequest, WrongTypesAndRangesNameTheParameter) {
  struct Case {
    ApiKind kind;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kCompletion, R"({"prompt": "a", "temperature": "1"})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt": "a", "temperature": 2.5})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt": "a", "max_tokens": 3.0})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt": "a", "max_tokens": 18446744073709551615})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt": "a", "n": 65})", "n"},
      {ApiKind::kCompletion, R"({"prompt": ["a", "b"], "n": 40})", "n"},
      {ApiKind::kCompletion, R"({"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})", "stop"},
      {ApiKind::kCompletion, R"({"prompt": [1, 2147483648]})", "prompt"},
      {ApiKind::kChat, R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": true})",
       "top_logprobs"},
      {ApiKind::kGenerate, R"({"text": ["a", 1]})", "text"},
      {ApiKind::kGenerate, R"({"text": "a", "sampling_params": {"top_p": -1}})", "sampling_params.top_p"},
      // top_k: -1 off, >= 1 kept; 0 and < -1 refused (SGLang's rule, one meaning everywhere)
      {ApiKind::kCompletion, R"({"prompt": "a", "top_k": 0})", "top_k"},
      {ApiKind::kCompletion, R"({"prompt": "a", "top_k": -2})", "top_k"},
      {ApiKind::kGenerate, R"({"text": "a", "sampling_params": {"top_k": 0}})", "sampling_params.top_k"},
  };
  for (const Case& c : cases) {
    const ApiError e = bad(c.kind, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(fp4moe::serve::testing::error_violation(e), "") << c.body;
  }
}

TEST(ApiRequest, TopKOffIsMinusOneAndZeroIsRefused) {
  EXPECT_EQ(ok(ApiKind::kCompletion, R"({"prompt": "a"})").sampling.top_k, -1);
  EXPECT_EQ(ok(ApiKind::kCompletion, R"({"prompt": "a", "top_k": -1})").sampling.top_k, -1);
  EXPECT_EQ(ok(ApiKind::kCompletion, R"({"prompt": "a", "top_k": 1})").sampling.top_k, 1);
  const ApiError e = bad(ApiKind::kCompletion, R"({"prompt": "a", "top_k": 0})");
  EXPECT_EQ(e.message, "'top_k' must be -1 (off) or at least 1, got 0");
}

TEST(ApiRequest, MalformedJsonAndDeepNestingAreOneLineErrors) {
  for (const std::string& body : {std::string("{"), std::string("nul"), std::string("{\"a\": \"\xff\"}"),
                                 std::string(100, '[') + std::string(100, ']'), std::string("")}) {
    const ApiError e = bad(ApiKind::kCompletion, body);
    EXPECT_EQ(fp4moe::serve::testing::error_violation(e), "") << body;
  }
  EXPECT_NE(bad(ApiKind::kCompletion, std::string(100, '[') + std::string(100, ']')).message.find("deeper"),
            std::string::npos);
}

TEST(ApiRequest, ErrorJsonHasOpenAIShape) {
  ApiError e{429, "full", "rate_limit_error", "", "queue_full"};
  const auto j = e.to_json();
  EXPECT_EQ(j["error"]["message"], "full");
  EXPECT_EQ(j["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(j["error"]["code"], "queue_full");
}

TEST(ApiRequest, TokenizeAndDetokenizeBodies) {
  auto t = parse_tokenize_request(R"({"text": "abc"})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_EQ(std::get<TokenizeRequest>(t).text, "abc");
  auto m = parse_tokenize_request(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(m));
  EXPECT_EQ(std::get<TokenizeRequest>(m).chat.messages.size(), 1u);
  auto d = parse_detokenize_request(R"({"tokens": [1, 2]})");
  ASSERT_TRUE(std::holds_alternative<std::vector<int32_t>>(d));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_detokenize_request(R"({"tokens": [-1]})")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_tokenize_request(R"({"prompt": 3})")));
}

// Random and mutated bodies through every parser in the normal build (the real fuzzer is
// fuzz/api_request_fuzz.cpp, run by tools/fuzz.sh api_request).
TEST(ApiRequest, MutatedBodiesGiveARequestWithinLimitsOrA400) {
  const char* seeds[] = {
      R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "logprobs": true, "top_logprobs": 2})",
      R"({"prompt": ["a", "b"], "n": 2, "stop": ["x"], "temperature": 0.5, "seed": 1, "logprobs": 3})",
      R"({"text": "a", "sampling_params": {"max_new_tokens": 3, "top_k": 5, "stop_token_ids": [1]}})",
      R"({"prompt": "abc"})", R"({"tokens": [1, 2, 3]})",
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "c",
        "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool",
        "tool_call_id": "c", "content": "r"}], "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"enable_thinking": false}, "tool_choice": "auto"})"};
  const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "-1", "0", "1e400", "2.5",
                          "18446744073709551616", "\"n\"", "\"prompt\"", "\"messages\"", "\"role\"", "\"content\"",
                          "\"stop\"", "\"max_tokens\"", "\"temperature\"", "\\u0000", "\xc3", "\xff",
                          "\"tools\"", "\"tool_choice\"", "\"none\"", "\"tool_calls\"", "\"arguments\""};
  std::mt19937_64 rng(1234);
  int accepted = 0;
  // Unknown keys are refused (a mutated key is one), so most mutations give a 400: 16k of them
  // leave a few dozen valid requests.
  for (int i = 0; i < 16000; ++i) {
    const std::string s = fp4moe::serve::testing::mutate(seeds[rng() % std::size(seeds)], tokens, rng);
    const int kind = int(rng() % 5);
    ASSERT_EQ(fp4moe::serve::testing::parse_violation(kind, s), "") << "kind " << kind << ": " << s;
    if (kind <= 2) accepted += std::holds_alternative<ApiRequest>(parse_api_request(ApiKind(kind), s));
  }
  EXPECT_GT(accepted, 20);  // the mutations leave some requests valid
}

// ---- issue 37: no field is silently ignored ----

TEST(ApiRequest, UnimplementedFieldsAreRefusedByName) {
  struct Case {
    ApiKind kind;
    const char* fields;  // spliced into a minimal valid body
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kChat, R"("response_format": {"type": "banana"})", "response_format.type"},
      {ApiKind::kChat, R"("response_format": {"type": "json_schema"})", "response_format.json_schema"},
      {ApiKind::kChat, R"("response_format": {"type": "json_object", "schema": {}})", "response_format.schema"},
      {ApiKind::kChat, R"("response_format": "json")", "response_format"},
      {ApiKind::kChat, R"("regex": 5)", "regex"},
      {ApiKind::kGenerate, R"("sampling_params": {"ebnf": ["x"]})", "sampling_params.ebnf"},
      {ApiKind::kGenerate, R"("sampling_params": {"json_schema": 1})", "sampling_params.json_schema"},
      {ApiKind::kCompletion, R"("regex": "a", "ebnf": "root ::= \"a\"")", "ebnf"},
      {ApiKind::kGenerate, R"("sampling_params": {"structural_tag": "{}"})", "sampling_params.structural_tag"},
      {ApiKind::kChat, R"("logit_bias": {"5": 10})", "logit_bias"},
      {ApiKind::kGenerate, R"("sampling_params": {"logit_bias": {"5": 1}})", "sampling_params.logit_bias"},
      {ApiKind::kChat, R"("tool_choice": "required")", "tool_choice"},
      {ApiKind::kChat, R"("stream": true, "stream_options": {"continuous_usage_stats": true})",
       "stream_options.continuous_usage_stats"},
      {ApiKind::kChat, R"("stream": true, "stream_options": {"bogus": 1})", "stream_options.bogus"},
      {ApiKind::kChat, R"("functions": [{"name": "f"}])", "functions"},
      {ApiKind::kChat, R"("function_call": "auto")", "function_call"},
      {ApiKind::kChat, R"("logprobs": 3)", "logprobs"},
      {ApiKind::kChat, R"("logprobs": "yes")", "logprobs"},
      {ApiKind::kCompletion, R"("suffix": "end")", "suffix"},
      {ApiKind::kCompletion, R"("best_of": 2)", "best_of"},
      {ApiKind::kCompletion, R"("echo": true)", "echo"},
      {ApiKind::kChat, R"("echo": true)", "echo"},
      {ApiKind::kChat, R"("audio": {"voice": "x", "format": "wav"})", "audio"},
      {ApiKind::kChat, R"("modalities": ["text", "audio"])", "modalities"},
      {ApiKind::kChat, R"("prediction": {"type": "content", "content": "x"})", "prediction"},
      {ApiKind::kChat, R"("service_tier": "priority")", "service_tier"},
      {ApiKind::kChat, R"("store": true)", "store"},
      {ApiKind::kChat, R"("reasoning_effort": "high")", "reasoning_effort"},
      {ApiKind::kChat, R"("top_a": 0.5)", "top_a"},
      {ApiKind::kCompletion, R"("min_tokens": 4)", "min_tokens"},
      {ApiKind::kGenerate, R"("sampling_params": {"min_new_tokens": 4})", "sampling_params.min_new_tokens"},
      {ApiKind::kChat, R"("no_stop_trim": true)", "no_stop_trim"},
      {ApiKind::kGenerate, R"("sampling_params": {"no_stop_trim": true})", "sampling_params.no_stop_trim"},
      {ApiKind::kChat, R"("return_hidden_states": true)", "return_hidden_states"},
      {ApiKind::kGenerate, R"("return_hidden_states": true)", "return_hidden_states"},
      {ApiKind::kChat, R"("lora_path": "a")", "lora_path"},
      {ApiKind::kGenerate, R"("lora_path": "a")", "lora_path"},
      {ApiKind::kChat, R"("continue_final_message": true)", "continue_final_message"},
      {ApiKind::kChat, R"("stream_reasoning": false)", "stream_reasoning"},
      {ApiKind::kChat, R"("guided_json": {})", "guided_json"},
      {ApiKind::kChat, R"("chat_template": "{{ x }}")", "chat_template"},
      {ApiKind::kGenerate, R"("image_data": "x.png")", "image_data"},
      {ApiKind::kGenerate, R"("logprob_start_len": 0)", "logprob_start_len"},
      {ApiKind::kGenerate, R"("return_text_in_logprobs": true)", "return_text_in_logprobs"},
      {ApiKind::kGenerate, R"("custom_logit_processor": "x")", "custom_logit_processor"},
      {ApiKind::kGenerate, R"("rid": "r1")", "rid"},
      {ApiKind::kChat, R"("frobnicate": 1)", "frobnicate"},
      {ApiKind::kCompletion, R"("frobnicate": [1, {}])", "frobnicate"},
      {ApiKind::kGenerate, R"("frobnicate": 1)", "frobnicate"},
      {ApiKind::kGenerate, R"("sampling_params": {"frobnicate": 1})", "sampling_params.frobnicate"},
      {ApiKind::kChat, R"("user": 5)", "user"},
  };
  for (const Case& c : cases) {
    const std::string head = c.kind == ApiKind::kChat         ? R"({"messages": [{"role": "user", "content": "x"}], )"
                             : c.kind == ApiKind::kCompletion ? R"({"prompt": "x", )"
                                                              : R"({"text": "x", )";
    const std::string body = head + c.fields + "}";
    const ApiError e = bad(c.kind, body);
    EXPECT_EQ(e.param, c.param) << body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
    EXPECT_EQ(fp4moe::serve::testing::error_violation(e), "") << body;
  }
  EXPECT_NE(bad(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "structural_tag": "a"})")
                .message.find("constrained decoding"),
            std::string::npos);
}

// ---- issue 42: structured output fields become one constraint ----

TEST(ApiRequest, StructuredOutputFieldsBecomeOneConstraint) {
  using fp4moe::grammar::Kind;
  struct Case {
    ApiKind kind;
    const char* fields;
    Kind want;
    const char* text;
    bool strict;
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kChat, R"("response_format": {"type": "json_object"})", Kind::kJsonObject, "", false, "response_format"},
      {ApiKind::kChat,
       R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}})",
       Kind::kJsonSchema, R"({"type":"object","properties":{"b":{},"a":{}}})", true, "response_format.json_schema.schema"},
      {ApiKind::kCompletion, R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})",
       Kind::kJsonSchema, "{}", false, "response_format.json_schema.schema"},
      {ApiKind::kChat, R"("regex": "a+")", Kind::kRegex, "a+", true, "regex"},
      {ApiKind::kChat, R"("ebnf": "root ::= \"a\"")", Kind::kEbnf, "root ::= \"a\"", true, "ebnf"},
      {ApiKind::kCompletion, R"("json_schema": "{\"type\": \"string\"}")", Kind::kJsonSchema,
       R"({"type": "string"})", true, "json_schema"},
      {ApiKind::kGenerate, R"("sampling_params": {"regex": "a"})", Kind::kRegex, "a", true, "sampling_params.regex"},
      {ApiKind::kGenerate, R"("sampling_params": {"json_schema": {"type": "integer"}})", Kind::kJsonSchema,
       R"({"type":"integer"})", true, "sampling_params.json_schema"},
  };
  for (const Case& c : cases) {
    const std::string head = c.kind == ApiKind::kChat         ? R"({"messages": [{"role": "user", "content": "x"}], )"
                             : c.kind == ApiKind::kCompletion ? R"({"prompt": "x", )"
                                                              : R"({"text": "x", )";
    const std::string body = head + c.fields + "}";
    auto r = parse_api_request(c.kind, body);
    ASSERT_TRUE(std::holds_alternative<ApiRequest>(r)) << body << " -> " << std::get<ApiError>(r).message;
    const auto& k = std::get<ApiRequest>(r).constraint;
    ASSERT_TRUE(k.has_value()) << body;
    EXPECT_EQ(k->spec.kind, c.want) << body;
    EXPECT_EQ(k->spec.text, c.text) << body;
    EXPECT_EQ(k->spec.strict, c.strict) << body;
    EXPECT_EQ(k->param, c.param) << body;
  }
  auto plain = parse_api_request(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}],
    "response_format": {"type": "text"}})");
  ASSERT_TRUE(std::holds_alternative<ApiRequest>(plain));
  EXPECT_FALSE(std::get<ApiRequest>(plain).constraint.has_value());
  // /generate reads sampling_params only: a top-level regex there is unknown.
  EXPECT_EQ(bad(ApiKind::kGenerate, R"({"text": "x", "regex": "a"})").param, "regex");
}

TEST(ApiRequest, DefaultValuesOfUnimplementedFieldsAndHarmlessFieldsAreAccepted) {
  ok(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"},
    "logit_bias": {}, "echo": false, "best_of": 1, "store": false, "modalities": ["text"], "service_tier": "auto",
    "user": "u", "metadata": {}, "stream": true, "stream_options": {"include_usage": true,
    "continuous_usage_stats": false, "include_obfuscation": true}, "min_tokens": 0, "no_stop_trim": false,
    "return_hidden_states": false, "stream_reasoning": true, "continue_final_message": false, "regex": null,
    "prompt_cache_key": "k", "safety_identifier": "s"})");
  ok(ApiKind::kCompletion, R"({"prompt": "x", "suffix": "", "echo": false, "best_of": 1, "suffix": null})");
  ok(ApiKind::kGenerate, R"({"text": "x", "logprob_start_len": -1, "return_text_in_logprobs": false,
    "log_metrics": true, "sampling_params": {"min_new_tokens": 0, "spaces_between_special_tokens": true,
    "stream_interval": 4, "no_stop_trim": false, "logit_bias": {}}})");
}

TEST(ApiRequest, SeedTakesTheWholeUint64Range) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], "seed": )";
  EXPECT_EQ(ok(ApiKind::kChat, chat + "18446744073709551615}").sampling.seed, UINT64_MAX);
  EXPECT_EQ(ok(ApiKind::kChat, chat + "9223372036854775808}").sampling.seed, uint64_t(1) << 63);
  EXPECT_EQ(ok(ApiKind::kChat, chat + "-9223372036854775808}").sampling.seed, uint64_t(1) << 63);
  for (const char* big : {"18446744073709551616}", "-9223372036854775809}", "1e30}"}) {
    const ApiError e = bad(ApiKind::kChat, chat + big);
    EXPECT_EQ(e.param, "seed");
    EXPECT_NE(e.message.find("must be in [-9223372036854775808, 18446744073709551615]"), std::string::npos)
        << e.message;
  }
  EXPECT_NE(bad(ApiKind::kChat, chat + "1.5}").message.find("must be an integer, not a float"), std::string::npos);
  // Other integers past int64 say so too (nlohmann reads them as floats).
  const ApiError e = bad(ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 18446744073709551616})");
  EXPECT_NE(e.message.find("must be in [1, "), std::string::npos) << e.message;
}

// ---- issue 41 item 1: tools, tool messages, template variables ----

namespace {
const char* kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "d",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add"}}])";
std::string chat_with(const std::string& fields) {
  return R"({"messages": [{"role": "user", "content": "x"}], )" + fields + "}";
}
}  // namespace

TEST(ApiRequest, ToolsAreValidatedAndRenderedUnlessToolChoiceIsNone) {
  auto r = ok(ApiKind::kChat, chat_with(std::string(R"("tools": )") + kTools));
  ASSERT_TRUE(r.chat.tools.is_array());
  EXPECT_EQ(r.chat.tools.size(), 2u);
  EXPECT_EQ(r.chat.tools, r.tools);
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  EXPECT_FALSE(r.skip_special_tokens);  // tool-call markers stay in the text
  // Key order as sent (the template's tojson prints it).
  EXPECT_EQ(r.chat.tools[0]["function"].dump().substr(0, 22), R"({"name":"get_weather",)");
  auto none = ok(ApiKind::kChat, chat_with(std::string(R"("tool_choice": "none", "tools": )") + kTools));
  EXPECT_TRUE(none.chat.tools.is_null());
  EXPECT_EQ(none.tools.size(), 2u);
  EXPECT_EQ(none.tool_choice, ToolChoice::kNone);
  EXPECT_TRUE(none.skip_special_tokens);
  EXPECT_TRUE(ok(ApiKind::kChat, chat_with(R"("tools": [])")).chat.tools.is_null());
  EXPECT_TRUE(ok(ApiKind::kChat, chat_with(std::string(R"("skip_special_tokens": true, "tools": )") + kTools))
                  .skip_special_tokens);
  auto flags = ok(ApiKind::kChat, chat_with(R"("parallel_tool_calls": false, "separate_reasoning": false)"));
  EXPECT_FALSE(flags.parallel_tool_calls);
  EXPECT_FALSE(flags.separate_reasoning);
  EXPECT_TRUE(ok(ApiKind::kChat, chat_with(R"("tool_choice": "auto")")).parallel_tool_calls);
  // "required" and a named function: parsed here, held to the tool-call format by the handler.
  auto required = ok(ApiKind::kChat, chat_with(std::string(R"("tool_choice": "required", "tools": )") + kTools));
  EXPECT_EQ(required.tool_choice, ToolChoice::kRequired);
  EXPECT_TRUE(required.chat.tools.is_array());
  auto named = ok(ApiKind::kChat, chat_with(std::string(R"("tool_choice": {"type": "function", "function": {"name": )"
                                                        R"("get_weather"}}, "tools": )") + kTools));
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice_name, "get_weather");

  struct Case {
    std::string fields;
    const char* param;
    const char* says;
  };
  const std::string tools = std::string(R"("tools": )") + kTools;
  const Case cases[] = {
      {R"("tools": {"type": "function"})", "tools", "must be an array"},
      {R"("tools": [{"type": "function", "function": {"description": "no name"}}])", "tools[0].function.name",
       "required"},
      {R"("tools": [{"type": "function", "function": {"name": ""}}])", "tools[0].function.name", "required"},
      {R"("tools": [{"type": "retrieval"}])", "tools[0].type", "'function'"},
      {R"("tools": [{"type": "function"}])", "tools[0].function", "required"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}])",
       "tools[0].function.parameters", "must be an object"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "strict": true}}])", "tools[0].function.strict",
       "constrained decoding"},
      {R"("tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])",
       "tools[1].function.name", "two tools"},
      {R"("tool_choice": "required")", "tool_choice", "needs a non-empty 'tools' list"},
      {R"("tools": [], "tool_choice": "required")", "tool_choice", "needs a non-empty 'tools' list"},
      {tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})", "tool_choice",
       "not in 'tools'"},
      {R"("tool_choice": {"type": "function", "function": {"name": "add"}})", "tool_choice", "not in 'tools'"},
      {tools + R"(, "tool_choice": "sometimes")", "tool_choice", "must be"},
      {tools + R"(, "tool_choice": {"type": "function"})", "tool_choice.function.name", "required"},
      {R"("parallel_tool_calls": "yes")", "parallel_tool_calls", "boolean"},
      {R"("separate_reasoning": 1)", "separate_reasoning", "boolean"},
      {R"("chat_template_kwargs": [1])", "chat_template_kwargs", "must be an object"},
      {R"("chat_template_kwargs": {"messages": []})", "chat_template_kwargs", "may not set 'messages'"},
  };
  for (const Case& c : cases) {
    const ApiError e = bad(ApiKind::kChat, chat_with(c.fields));
    EXPECT_EQ(e.param, c.param) << c.fields << " -> " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << e.message;
    EXPECT_EQ(fp4moe::serve::testing::error_violation(e), "");
  }
}

TEST(ApiRequest, ToolCallsToolMessagesAndTextPartsAreValidated) {
  auto r = ok(ApiKind::kChat, R"({"messages": [
    {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "reasoning_content": "think", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"n\": [1, {\"x\": \"\u00e9\"}]}"}},
      {"id": "call_2", "type": "function", "index": 1, "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "name": "add", "content": [{"type": "text", "text": "3"}]}],
    "chat_template_kwargs": {"enable_thinking": false, "clear_thinking": true}})");
  const auto& m = r.chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0]["content"], "be brief");
  EXPECT_EQ(m[2]["content"], "");
  EXPECT_EQ(m[2]["reasoning_content"], "think");
  const auto& calls = m[2]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["id"], "call_1");
  EXPECT_EQ(calls[0]["function"]["arguments"]["city"], "Paris");  // a JSON string becomes an object
  EXPECT_EQ(calls[0]["function"]["arguments"]["n"][1]["x"], "\u00e9");
  EXPECT_EQ(calls[1]["function"]["arguments"]["b"], 2);
  EXPECT_FALSE(calls[1].contains("index"));
  EXPECT_EQ(m[3]["tool_call_id"], "call_1");
  EXPECT_EQ(m[4]["name"], "add");
  EXPECT_EQ(m[4]["content"], "3");
  EXPECT_EQ(r.chat.kwargs["enable_thinking"], false);
  EXPECT_EQ(r.chat.kwargs.dump(), R"({"enable_thinking":false,"clear_thinking":true})");

  struct Case {
    const char* messages;
    const char* param;
  };
  const Case cases[] = {
      {R"([{"role": "tool", "content": "x"}])", "messages[0].tool_call_id"},
      {R"([{"role": "tool", "tool_call_id": 5, "content": "x"}])", "messages[0].tool_call_id"},
      {R"([{"role": "user", "content": "x", "tool_call_id": "c"}])", "messages[0].tool_call_id"},
      {R"([{"role": "user", "content": "x", "tool_calls": []}])", "messages[0].tool_calls"},
      {R"([{"role": "assistant", "tool_calls": {"id": "c"}}])", "messages[0].tool_calls"},
      {R"([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}])", "messages[0].tool_calls[0].function"},
      {R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].function.name"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}])",
       "messages[0].tool_calls[0].function.arguments"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])",
       "messages[0].tool_calls[0].function.arguments"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}])",
       "messages[0].tool_calls[0].function.arguments"},
      {R"([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}])",
       "messages[0].tool_calls[0].type"},
      {R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
       "messages[0].content[0].type"},
      {R"([{"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]}])",
       "messages[0].content[0].extra"},
      {R"([{"role": "user", "content": "x", "reasoning_content": "r"}])", "messages[0].reasoning_content"},
      {R"([{"role": "user", "content": "x", "audio": {"id": "a"}}])", "messages[0].audio"},
  };
  for (const Case& c : cases) {
    const ApiError e = bad(ApiKind::kChat, std::string(R"({"messages": )") + c.messages + "}");
    EXPECT_EQ(e.param, c.param) << c.messages << " -> " << e.message;
    EXPECT_EQ(fp4moe::serve::testing::error_violation(e), "");
  }
}

TEST(ApiRequest, TokenizeTakesToolsAndTemplateVariables) {
  auto t = parse_tokenize_request(std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": )") +
                                  kTools + R"(, "chat_template_kwargs": {"enable_thinking": true},
    "add_generation_prompt": false})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t)) << std::get<ApiError>(t).message;
  const ChatInput& c = std::get<TokenizeRequest>(t).chat;
  EXPECT_EQ(c.tools.size(), 2u);
  EXPECT_EQ(c.kwargs["enable_thinking"], true);
  EXPECT_FALSE(c.add_generation_prompt);
  auto none = parse_tokenize_request(std::string(R"({"messages": [{"role": "user", "content": "x"}],
    "tool_choice": "none", "tools": )") + kTools + "}");
  EXPECT_TRUE(std::get<TokenizeRequest>(none).chat.tools.is_null());
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_tokenize_request(R"({"prompt": "x", "frobnicate": 1})")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(
      parse_tokenize_request(R"({"messages": [{"role": "user", "content": "x"}], "tools": 5})")));
}
