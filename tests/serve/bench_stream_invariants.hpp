// What bench serve's parsers of server bytes must guarantee for any input (shared by the
// libFuzzer target fuzz/bench_stream_fuzz.cpp and the mutation test in bench_serve_test.cpp):
//   kind 0/1: the bytes as a streamed response (completions / chat), fed in pieces at rising
//             times: the result has ttft <= latency, no negative ITL, a non-negative output
//             count, and success exactly when there is no error message;
//   kind 2:   the bytes as a JSONL dataset: prompts that are non-empty strings or id lists
//             with in-range ids, positive output lengths, or an fp4moe::Error.
// Returns "" or what broke. Other exceptions propagate (the fuzzer reports them).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "serve/bench_serve.hpp"

namespace fp4moe::serve::testing {

inline std::string bench_stream_violation(int kind, std::string_view bytes) {
  using namespace fp4moe::serve::bench;
  if (kind == 2) {
    try {
      const auto prompts = parse_jsonl_dataset(bytes, "fuzz.jsonl", 3, 7);
      if (prompts.size() != 3) return "not num_prompts prompts";
      for (const BenchPrompt& p : prompts) {
        if (p.output_len <= 0) return "an output length <= 0";
        if (p.prompt.is_string()) {
          if (p.prompt.get<std::string>().empty()) return "an empty text prompt";
        } else if (p.prompt.is_array()) {
          if (p.prompt.empty() || p.input_len != int32_t(p.prompt.size())) return "an id prompt of a wrong length";
          for (const auto& t : p.prompt)
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
              return "an id out of range";
        } else {
          return "a prompt that is neither text nor ids";
        }
      }
    } catch (const fp4moe::Error&) {
    }
    return "";
  }
  StreamAccumulator acc(kind == 1);
  SseParser sse;
  std::vector<std::string> payloads;
  double t = 0.0;
  // Pieces of 1, 2, 3, ... bytes, each arriving 1 ms after the last.
  for (size_t pos = 0, len = 1; pos < bytes.size(); pos += len, ++len) {
    payloads.clear();
    sse.feed(bytes.substr(pos, len), payloads);
    t += 0.001;
    for (const std::string& p : payloads) acc.on_payload(p, t);
  }
  const RequestResult r = acc.finish(200, bytes.substr(0, 256), t + 0.001, "");
  if (r.ttft < 0 || r.ttft > r.latency) return "ttft outside [0, latency]";
  for (double x : r.itl)
    if (x < 0) return "a negative inter-token latency";
  if (r.output_len < 0 || r.prompt_len < 0) return "a negative token count";
  if (r.success != r.error.empty()) return "success and error disagree";
  return "";
}

}  // namespace fp4moe::serve::testing
