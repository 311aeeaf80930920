#!/usr/bin/env python3
"""Seed corpora and dictionaries for serve/'s fuzz targets (tools/fuzz.sh SECONDS TARGET).

    fuzz_seeds.py api_request|bench_stream CORPUS_DIR DICT_PATH

api_request: an input's first byte picks the parser (0 chat, 1 completions, 2 generate,
3 tokenize, 4 detokenize); the rest is the HTTP body.
bench_stream: the first byte picks 0 a completions SSE stream, 1 a chat SSE stream, 2 a JSONL
dataset; the rest is the bytes.
http_request: the bytes a client sends (request heads, well-formed and not).
"""
import json
import os
import sys

target, corpus, dict_path = sys.argv[1], sys.argv[2], sys.argv[3]
assert target in ("api_request", "bench_stream", "http_request", "tool_call_parser"), target
if target == "tool_call_parser":  # the reasoning / tool-call parsers: from their goldens' generator
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "serve", "data"))
    import gen_parser_goldens
    gen_parser_goldens.fuzz_seeds(corpus, dict_path)
    sys.exit(0)


def write_dict(tokens):
    """libFuzzer's dictionary format: one quoted token a line; backslash, quote and \\xNN escapes."""
    def esc(c):
        return {"\\": "\\\\", '"': '\\"'}.get(c, c if 32 <= ord(c) < 127 else "\\x%02X" % ord(c))
    with open(dict_path, "w") as f:
        for t in tokens:
            f.write('"%s"\n' % "".join(esc(c) for c in t))


if target == "http_request":
    os.makedirs(corpus, exist_ok=True)
    seeds = {
        "get": b"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k\r\n\r\n",
        "post": b"POST /generate HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}",
        "http10": b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "two_lengths": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "chunked": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "desync": b"BAD\r\nx\r\nGET /get_server_info HTTP/1.1\r\nHost: a\r\n\r\n",
        "fold": b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
    }
    for name, b in seeds.items():
        with open(os.path.join(corpus, "seed_" + name), "wb") as f:
            f.write(b)
    write_dict(["\r\n", "\r\n\r\n", "GET ", "POST ", " HTTP/1.1", " HTTP/1.0", "Host: ", "Content-Length: ",
                "Transfer-Encoding: chunked", "Connection: close", "Connection: keep-alive", "Expect: 100-continue",
                ": ", "?", "#", "\t", " ", "\n", "\r", "\x00", "\x7f", "\xff", "18446744073709551616"])
    sys.exit(0)
if target == "bench_stream":
    os.makedirs(corpus, exist_ok=True)
    def sse(events):
        return "".join("data: %s\n\n" % (e if isinstance(e, str) else json.dumps(e)) for e in events).encode()
    seeds = {
        "completions": bytes([0]) + sse([{"choices": [{"index": 0, "text": "he"}]},
                                         {"choices": [{"index": 0, "text": "llo", "finish_reason": "length"}]},
                                         {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
                                         "[DONE]"]),
        "chat": bytes([1]) + sse([{"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                                  {"choices": [{"index": 0, "delta": {"content": "x"}}]}, "[DONE]"]),
        "error": bytes([0]) + sse([{"error": {"message": "m", "type": "t"}}, "[DONE]"]),
        "jsonl": bytes([2]) + b'{"prompt": "hi", "output_len": 4}\n\n{"prompt": [1, 2], "max_tokens": 2}\n',
    }
    for name, b in seeds.items():
        with open(os.path.join(corpus, "seed_" + name), "wb") as f:
            f.write(b)
    write_dict(["data: ", "\n\n", "\r\n", "[DONE]", '"choices"', '"text"', '"delta"', '"content"', '"usage"',
                '"prompt_tokens"', '"completion_tokens"', '"finish_reason"', '"abort"', '"error"', '"message"',
                '"prompt"', '"output_len"', '"max_tokens"', "{", "}", "[", "]", ":", ",", "null", "-1", "1e309",
                "2147483648"])
    sys.exit(0)
seeds = {
    0: {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "hi"}]}], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 4,
        "logprobs": True, "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True}, "n": 2,
        "stop": ["a", "b"], "seed": 3, "max_completion_tokens": 4},
    1: {"prompt": ["a", "b"], "n": 2, "stop": "x", "logprobs": 3, "min_p": 0.1, "presence_penalty": 1,
        "frequency_penalty": -1, "repetition_penalty": 1.2, "ignore_eos": True, "stop_token_ids": [1, 2]},
    2: {"text": "a", "sampling_params": {"max_new_tokens": 3, "top_k": 5, "stop_token_ids": [1], "sampling_seed": 9},
        "return_logprob": True, "top_logprobs_num": 2, "stream": False},
    3: {"prompt": "abc", "messages": [{"role": "user", "content": "x"}]},
    4: {"tokens": [1, 2, 3]},
}
# Issue 41's chat fields (tools, tool calls, tool messages, template variables) and issue 37's
# refused fields at their accepted defaults.
tool = {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
extra_seeds = {
    "tools": (0, {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"P\"}"}},
            {"id": "c2", "type": "function", "index": 1, "function": {"name": "get_weather", "arguments": {"a": [1]}}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}],
        "tools": [tool], "tool_choice": "auto", "parallel_tool_calls": False, "separate_reasoning": True,
        "chat_template_kwargs": {"enable_thinking": False}}),
    "tool_choice": (0, {"messages": [{"role": "user", "content": "x"}], "tools": [tool],
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    "tool_choice_required": (0, {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools": [
        tool, {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "s": {"type": "string", "maxLength": 4}, "e": {"enum": ["a b", "c"]}, "n": {"type": "integer", "minimum": 0},
            "o": {"type": "object", "properties": {"t": {"type": "array", "items": {"type": "string"}}}},
            "u": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["s"], "$defs": {}}}}]}),
    "defaults": (0, {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"},
                     "logit_bias": {}, "stream": True, "stream_options": {"include_usage": True,
                     "continuous_usage_stats": False}, "user": "u", "seed": 18446744073709551615}),
    "generate_defaults": (2, {"text": "x", "logprob_start_len": -1, "sampling_params": {"min_new_tokens": 0,
                              "regex": None, "stream_interval": 2}}),
    "tokenize_tools": (3, {"messages": [{"role": "user", "content": "x"}], "tools": [tool],
                           "chat_template_kwargs": {"k": 1}, "add_generation_prompt": False}),
}
os.makedirs(corpus, exist_ok=True)
for kind, body in seeds.items():
    with open(os.path.join(corpus, f"seed_{kind}"), "wb") as f:
        f.write(bytes([kind]) + json.dumps(body).encode())
    with open(os.path.join(corpus, f"seed_ids_{kind}"), "wb") as f:
        f.write(bytes([kind]) + b'{"prompt": [[1, 2], [3]], "input_ids": [[4]], "text": ["x", "y"]}')
for name, (kind, body) in extra_seeds.items():
    with open(os.path.join(corpus, f"seed_{name}"), "wb") as f:
        f.write(bytes([kind]) + json.dumps(body).encode())
keys = ["model", "messages", "role", "content", "type", "text", "prompt", "input_ids", "sampling_params",
        "max_tokens", "max_new_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "sampling_seed", "stop",
        "stop_token_ids", "n", "logprobs", "top_logprobs", "top_logprobs_num", "return_logprob", "stream",
        "stream_options", "include_usage", "ignore_eos", "skip_special_tokens", "echo", "logit_bias", "tokens",
        "add_generation_prompt", "user", "assistant", "system", "tool", "tools", "tool_choice", "tool_calls",
        "tool_call_id", "function", "name", "arguments", "parameters", "description", "strict", "auto", "none",
        "required", "parallel_tool_calls", "separate_reasoning", "chat_template_kwargs", "reasoning_content",
        "response_format", "json_object", "json_schema", "regex", "ebnf", "best_of", "suffix", "min_tokens",
        "continuous_usage_stats", "logprob_start_len", "id", "index"]
tokens = ['"%s"' % k for k in keys] + ['{', '}', '[', ']', ':', ',', 'null', 'true', 'false', '-1', '0', '1e309',
                                      '2.5', '18446744073709551616', '9223372036854775807', '\\u0000', '\\ud800']
write_dict(tokens)
