#!/usr/bin/env python3
"""Seed corpus and dictionary for the server's fuzz target (tools/fuzz.sh SECONDS api_request).

    fuzz_seeds.py api_request CORPUS_DIR DICT_PATH

An input's first byte picks the parser (0 chat, 1 completions, 2 generate, 3 tokenize,
4 detokenize); the rest is the HTTP body.
"""
import json
import os
import sys

target, corpus, dict_path = sys.argv[1], sys.argv[2], sys.argv[3]
assert target == "api_request", target
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
os.makedirs(corpus, exist_ok=True)
for kind, body in seeds.items():
    with open(os.path.join(corpus, f"seed_{kind}"), "wb") as f:
        f.write(bytes([kind]) + json.dumps(body).encode())
    with open(os.path.join(corpus, f"seed_ids_{kind}"), "wb") as f:
        f.write(bytes([kind]) + b'{"prompt": [[1, 2], [3]], "input_ids": [[4]], "text": ["x", "y"]}')
keys = ["model", "messages", "role", "content", "type", "text", "prompt", "input_ids", "sampling_params",
        "max_tokens", "max_new_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "sampling_seed", "stop",
        "stop_token_ids", "n", "logprobs", "top_logprobs", "top_logprobs_num", "return_logprob", "stream",
        "stream_options", "include_usage", "ignore_eos", "skip_special_tokens", "echo", "logit_bias", "tokens",
        "add_generation_prompt", "user", "assistant", "system", "tool"]
tokens = ['"%s"' % k for k in keys] + ['{', '}', '[', ']', ':', ',', 'null', 'true', 'false', '-1', '0', '1e309',
                                      '2.5', '18446744073709551616', '9223372036854775807', '\\u0000', '\\ud800']
with open(dict_path, "w") as f:
    for t in tokens:
        f.write('"%s"\n' % t.replace("\\", "\\\\").replace('"', '\\"'))
