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
    "stream_options": {"include_usage": true}, "ignore_eos": true, "unknown": {"deep": [1, 2]}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[2]["content"], "");
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
  };
  for (const Case& c : cases) {
    const ApiError e = bad(c.kind, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(fp4moe::serve::testing::error_violation(e), "") << c.body;
  }
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
  EXPECT_EQ(std::get<TokenizeRequest>(m).messages.size(), 1u);
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
      R"({"prompt": "abc"})", R"({"tokens": [1, 2, 3]})"};
  const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "-1", "0", "1e400", "2.5",
                          "18446744073709551616", "\"n\"", "\"prompt\"", "\"messages\"", "\"role\"", "\"content\"",
                          "\"stop\"", "\"max_tokens\"", "\"temperature\"", "\\u0000", "\xc3", "\xff"};
  std::mt19937_64 rng(1234);
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string s = fp4moe::serve::testing::mutate(seeds[rng() % std::size(seeds)], tokens, rng);
    const int kind = int(rng() % 5);
    ASSERT_EQ(fp4moe::serve::testing::parse_violation(kind, s), "") << "kind " << kind << ": " << s;
    if (kind <= 2) accepted += std::holds_alternative<ApiRequest>(parse_api_request(ApiKind(kind), s));
  }
  EXPECT_GT(accepted, 20);  // the mutations leave some requests valid
}
