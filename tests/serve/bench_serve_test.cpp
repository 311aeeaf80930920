// bench serve's pieces without a server: datasets, arrivals, SSE parsing, the per-request
// accumulator, percentiles and the report (text layout and JSON keys).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.hpp"
#include "core/progress.hpp"
#include "serve/bench_serve.hpp"
#include "serve/bench_stream_invariants.hpp"
#include "serve/mutate.hpp"

using namespace fp4moe;
using namespace fp4moe::serve::bench;

TEST(BenchServe, RandomDatasetLengthsAndIdsStayInRangeAndRepeatWithTheSeed) {
  RandomDatasetOptions o;
  o.num_prompts = 200;
  o.input_len = 40;
  o.output_len = 10;
  o.range_ratio = 0.5;
  o.vocab_size = 97;
  o.seed = 3;
  const auto a = make_random_dataset(o);
  ASSERT_EQ(a.size(), 200u);
  bool short_in = false, full_in = false;
  for (const BenchPrompt& p : a) {
    ASSERT_TRUE(p.prompt.is_array());
    EXPECT_EQ(int32_t(p.prompt.size()), p.input_len);
    EXPECT_GE(p.input_len, 20);
    EXPECT_LE(p.input_len, 40);
    EXPECT_GE(p.output_len, 5);
    EXPECT_LE(p.output_len, 10);
    short_in |= p.input_len < 30;
    full_in |= p.input_len == 40;
    for (const auto& t : p.prompt) {
      EXPECT_GE(t.get<int>(), 0);
      EXPECT_LT(t.get<int>(), 97);
    }
  }
  EXPECT_TRUE(short_in && full_in);
  const auto b = make_random_dataset(o);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].prompt, b[i].prompt);
  o.range_ratio = 1.0;
  for (const BenchPrompt& p : make_random_dataset(o)) EXPECT_EQ(p.input_len, 40);
  o.vocab_size = 0;
  EXPECT_THROW(make_random_dataset(o), Error);
}

TEST(BenchServe, JsonlDatasetReadsPromptsAndNamesTheBadLine) {
  const auto p = parse_jsonl_dataset("{\"prompt\": \"hi\", \"output_len\": 7}\n\n{\"prompt\": [1, 2, 3]}\n", "f.jsonl",
                                     5, 16);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0].prompt, "hi");
  EXPECT_EQ(p[0].output_len, 7);
  EXPECT_EQ(p[1].input_len, 3);
  EXPECT_EQ(p[1].output_len, 16);
  EXPECT_EQ(p[2].prompt, "hi");  // cycled
  for (const char* bad : {"{\"prompt\": 5}", "[1]", "{\"x\": 1}", "{\"prompt\": \"a\", \"output_len\": 0}",
                          "{\"prompt\": [-1]}", "not json", ""}) {
    try {
      parse_jsonl_dataset(std::string("{\"prompt\": \"ok\"}\n") + bad, "f.jsonl", 1, 4);
      EXPECT_EQ(std::string(bad), "") << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad).empty() ? "f.jsonl" : "f.jsonl:2"), std::string::npos)
          << e.what();
    }
  }
}

TEST(BenchServe, PoissonArrivalsHaveTheRequestedMeanRate) {
  const auto inf = poisson_arrivals(10, INFINITY, 1);
  for (double t : inf) EXPECT_EQ(t, 0.0);
  const auto t = poisson_arrivals(20000, 50.0, 1);
  EXPECT_EQ(t[0], 0.0);
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  EXPECT_NEAR(double(t.size() - 1) / t.back(), 50.0, 2.0);
  EXPECT_THROW(poisson_arrivals(3, 0.0, 1), Error);
}

TEST(BenchServe, SseParserJoinsSplitLinesAndSkipsOtherFields) {
  SseParser p;
  std::vector<std::string> out;
  p.feed("data: {\"a\"", out);
  EXPECT_TRUE(out.empty());
  p.feed(":1}\r\n\r\n: comment\nevent: x\ndata:[DONE]\n", out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], "{\"a\":1}");
  EXPECT_EQ(out[1], "[DONE]");
}

// A usage count outside [0, 2^31) is the server's error (the request fails with it), never a
// count wrapped into the int32 it is kept in (a bench_stream fuzz finding, kept as a regression).
TEST(BenchServe, AUsageCountOutOfRangeIsAnError) {
  for (const char* usage : {R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2777777777777777}})",
                            R"({"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":2}})",
                            R"({"choices":[],"usage":{"prompt_tokens":2147483648,"completion_tokens":2}})"}) {
    StreamAccumulator a(false);
    a.on_payload(R"({"choices":[{"index":0,"text":"x"}]})", 0.01);
    a.on_payload(usage, 0.02);
    a.on_payload("[DONE]", 0.03);
    const RequestResult r = a.finish(200, "", 0.04, "");
    EXPECT_FALSE(r.success) << usage;
    EXPECT_NE(r.error.find("out of range"), std::string::npos) << r.error;
    EXPECT_GE(r.output_len, 0);
    EXPECT_GE(r.prompt_len, 0);
  }
}

TEST(BenchServe, AccumulatorTimesTextChunksAndReadsUsage) {
  StreamAccumulator a(false);
  EXPECT_TRUE(a.on_payload(R"({"choices":[{"index":0,"text":""}]})", 0.01));
  EXPECT_TRUE(a.on_payload(R"({"choices":[{"index":0,"text":"he"}]})", 0.10));
  EXPECT_TRUE(a.on_payload(R"({"choices":[{"index":0,"text":"llo"}]})", 0.15));
  EXPECT_TRUE(a.on_payload(R"({"choices":[{"index":0,"text":"!","finish_reason":"length"}]})", 0.35));
  EXPECT_TRUE(a.on_payload(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}})", 0.36));
  EXPECT_FALSE(a.on_payload("[DONE]", 0.37));
  const RequestResult r = a.finish(200, "", 0.40, "");
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft, 0.10);
  ASSERT_EQ(r.itl.size(), 2u);
  EXPECT_NEAR(r.itl[0], 0.05, 1e-12);
  EXPECT_NEAR(r.itl[1], 0.20, 1e-12);
  EXPECT_EQ(r.prompt_len, 12);
  EXPECT_EQ(r.output_len, 5);
  EXPECT_DOUBLE_EQ(r.latency, 0.40);

  StreamAccumulator chat(true);
  chat.on_payload(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})", 0.01);
  chat.on_payload(R"({"choices":[{"index":0,"delta":{"content":"x"}}]})", 0.02);
  chat.on_payload("[DONE]", 0.03);
  const RequestResult c = chat.finish(200, "", 0.03, "");
  EXPECT_TRUE(c.success);
  EXPECT_DOUBLE_EQ(c.ttft, 0.02);
  EXPECT_EQ(c.output_len, 1);  // no usage: chunks with text
}

TEST(BenchServe, AccumulatorFailures) {
  EXPECT_EQ(StreamAccumulator(false).finish(400, R"({"error":{"message":"bad max_tokens"}})", 0.1, "").error,
            "HTTP 400: bad max_tokens");
  EXPECT_EQ(StreamAccumulator(false).finish(0, "", 0.1, "connection: refused").error, "connection: refused");
  StreamAccumulator cut(false);
  cut.on_payload(R"({"choices":[{"text":"a"}]})", 0.1);
  EXPECT_FALSE(cut.finish(200, "", 0.2, "").success);  // no [DONE]
  StreamAccumulator aborted(false);
  aborted.on_payload(R"({"choices":[{"text":"","finish_reason":"abort"}]})", 0.1);
  aborted.on_payload("[DONE]", 0.1);
  EXPECT_FALSE(aborted.finish(200, "", 0.2, "").success);
  StreamAccumulator err(false);
  err.on_payload(R"({"error":{"message":"engine failed"}})", 0.1);
  err.on_payload("[DONE]", 0.1);
  EXPECT_EQ(err.finish(200, "", 0.2, "").error, "engine failed");
}

TEST(BenchServe, PercentileInterpolatesLikeNumpy) {
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 99), 4.96);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
}

TEST(BenchServe, SummaryReportAndJson) {
  RunResult run;
  run.duration = 2.0;
  RequestResult a;
  a.success = true, a.prompt_len = 10, a.output_len = 5, a.ttft = 0.1, a.latency = 0.5, a.itl = {0.1, 0.1, 0.1, 0.1};
  RequestResult b = a;
  b.ttft = 0.3, b.latency = 1.1, b.itl = {0.2, 0.2, 0.2, 0.2};
  RequestResult f;
  f.error = "HTTP 429: queue full";
  run.results = {a, b, f};
  const Summary s = summarize(run, "openai", "random", INFINITY, 0);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input, 20);
  EXPECT_EQ(s.total_output, 10);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 5.0);
  EXPECT_DOUBLE_EQ(s.total_throughput, 15.0);
  EXPECT_NEAR(s.mean_ttft_ms, 200.0, 1e-9);
  EXPECT_NEAR(s.mean_tpot_ms, 150.0, 1e-9);  // (0.4/4 + 0.8/4) / 2
  EXPECT_NEAR(s.mean_itl_ms, 150.0, 1e-9);
  EXPECT_NEAR(s.max_itl_ms, 200.0, 1e-9);
  EXPECT_NEAR(s.concurrency, 0.8, 1e-12);
  ASSERT_EQ(s.errors.size(), 1u);

  const std::string text = format_report(s);
  EXPECT_EQ(text.find("============ Serving Benchmark Result ============\n"), 0u) << text;
  EXPECT_NE(text.find("Successful requests:                     2         \n"), std::string::npos) << text;
  EXPECT_NE(text.find("Failed requests:                         1"), std::string::npos);
  EXPECT_NE(text.find("Traffic request rate:                    inf"), std::string::npos);
  EXPECT_NE(text.find("---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(text.find("Mean TPOT (ms):                          150.00"), std::string::npos);
  EXPECT_NE(text.find("P99 ITL (ms):"), std::string::npos);

  const auto j = report_json(s, run, true);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  for (const char* k : {"duration", "total_input_tokens", "total_output_tokens", "request_throughput",
                        "input_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                        "mean_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["ttfts"].size(), 3u);
  EXPECT_EQ(j["errors"][2], "HTTP 429: queue full");
}

TEST(Progress, RenderShowsCountsAndAFilledBar) {
  EXPECT_EQ(ProgressBar::render("req", 5, 10, 2.0, 10), "req [#####.....] 5/10 ( 50%) 2.0 s, 2.50/s");
  EXPECT_EQ(ProgressBar::render("req", 0, 0, 0.0, 4), "req [####] 0/0 (100%) 0.0 s, 0.00/s");
}

// Mutated streams and JSONL files through bench serve's parsers in the normal build (the real
// fuzzer is fuzz/bench_stream_fuzz.cpp, run by tools/fuzz.sh SECONDS bench_stream).
TEST(BenchServe, MutatedStreamsAndDatasetsKeepTheInvariants) {
  const char* seeds[] = {
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,"
      "\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
      "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n",
      "data: {\"error\":{\"message\":\"m\"}}\n\n",
      "{\"prompt\": \"hi\", \"output_len\": 4}\n{\"prompt\": [1, 2], \"max_tokens\": 2}\n"};
  const char* tokens[] = {"data: ", "\n", "\r\n", "[DONE]", "{", "}", "[", "]", ",", ":", "\"", "null", "-1",
                          "1e400", "2147483648", "\"text\"", "\"usage\"", "\"prompt\"", "\"output_len\"", "\xff"};
  std::mt19937_64 rng(99);
  for (int i = 0; i < 3000; ++i) {
    const std::string s = fp4moe::serve::testing::mutate(seeds[rng() % std::size(seeds)], tokens, rng);
    const int kind = int(rng() % 3);
    ASSERT_EQ(fp4moe::serve::testing::bench_stream_violation(kind, s), "") << "kind " << kind << ": " << s;
  }
}
