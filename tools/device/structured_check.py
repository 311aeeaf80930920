#!/usr/bin/env python3
"""Structured output through a running server, checked by independent validators (json + the
schema's own rules written out here, re.fullmatch): a JSON-schema request and a regex request,
greedy and sampled, n each. No third-party packages (the GPU machine has none).
    structured_check.py PORT [N]"""
import json, re, sys, urllib.request

port = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
          "count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
          "maxItems": 3}}, "required": ["name", "count", "tags"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{4}( OK| NO)"


def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


def valid_schema(text):
    o = json.loads(text)
    assert isinstance(o, dict) and set(o) == {"name", "count", "tags"}, o
    assert isinstance(o["name"], str) and len(o["name"]) <= 16, o
    assert isinstance(o["count"], int) and not isinstance(o["count"], bool), o
    assert isinstance(o["tags"], list) and len(o["tags"]) <= 3 and all(t in ("a", "b", "c") for t in o["tags"]), o


MODEL = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).read())["data"][0]["id"]
bad = 0
for i in range(n):
    temp = 0.0 if i == 0 else 0.9
    msgs = [{"role": "user", "content": "Describe a Python module as JSON."}]
    r = post({"model": MODEL, "messages": msgs, "max_tokens": 96, "temperature": temp, "seed": i,
              "response_format": {"type": "json_schema", "json_schema": {"name": "mod", "schema": SCHEMA}}})
    t = r["choices"][0]["message"]["content"]
    try: valid_schema(t); ok = "valid"
    except Exception as e: ok = f"INVALID ({e!r})"; bad += 1
    print(f"json_schema T {temp}: {ok}: {t[:100]!r} (finish {r['choices'][0]['finish_reason']})")
    if ok != "valid": print("   ", json.dumps({k: v for k, v in r["choices"][0].items() if k != "message"})[:400])
    r = post({"model": MODEL, "messages": msgs, "max_tokens": 32, "temperature": temp, "seed": i, "regex": REGEX})
    t = r["choices"][0]["message"]["content"]
    ok = "valid" if re.fullmatch(REGEX, t) else "INVALID"; bad += ok != "valid"
    print(f"regex T {temp}: {ok}: {t!r}")
    if ok != "valid": print("   ", json.dumps({k: v for k, v in r["choices"][0].items() if k != "message"})[:400])
# The native /generate (SGLang's): its meta_info says why a request was aborted.
for i in range(1, n):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(
        {"text": "def f(x):\n    ", "sampling_params": {"regex": REGEX, "temperature": 0.9, "max_new_tokens": 32,
                                                        "sampling_seed": 100 + i}}).encode(), {"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=120).read())
    ok = "valid" if re.fullmatch(REGEX, r["text"]) else "INVALID"; bad += ok != "valid"; n += 0.5
    print(f"/generate regex T 0.9: {ok}: {r['text']!r} finish {json.dumps(r['meta_info']['finish_reason'])}")
print(f"structured output: {int(2 * n) - bad} of {int(2 * n)} valid")
sys.exit(1 if bad else 0)
