#!/usr/bin/env bash
# The main job on the embedded default backend (CPU): serve the small trained GLM-5-architecture
# NVFP4 model shipped in models/glm5-mini-py and answer a real chat request through the OpenAI API.
#   1. the model: GlmMoeDsaForCausalLM at toy size (MLA + DSA indexer, 16 routed experts top-2 +
#      a shared expert, one MTP layer), trained on CPython's standard-library sources with its own
#      byte-level BPE tokenizer (tools/train_small/, models/glm5-mini-py/README.md), routed experts
#      NVFP4 (fp4moe quantize, ModelOpt layout), 14 MB
#   2. fp4moe serve --backend cpu on a free local port (its start-up line says what was loaded)
#   3. one chat completion with the openai client (the user turn is a module's one-line summary,
#      as in training; the reply is Python-looking code), one with tools (and the tool-call parser
#      on a GLM-4.7 call through /parse_function_call), the same with tool_choice naming the
#      function (constrained decoding: a call that parses, arguments that fit the schema), one with
#      response_format json_schema, then a short fp4moe bench serve run
#   4. SIGTERM: the server drains and exits 0
# A small model trained for 50 minutes on one shared CPU core: the code it writes looks like the
# standard library's, it does not do what was asked.
#   ./demo.sh              uses build/bin/fp4moe (./setup.sh builds it) and /tmp/fp4moe-demo
# Environment: BUILD_DIR (default build), FP4MOE_DEMO_DIR (default /tmp/fp4moe-demo).
set -euo pipefail
cd "$(dirname "$0")"
BIN=${BUILD_DIR:-build}/bin/fp4moe
WORK=${FP4MOE_DEMO_DIR:-/tmp/fp4moe-demo}
MODEL=models/glm5-mini-py
NAME=glm5-mini-py
if [ ! -x "$BIN" ]; then
  echo "demo.sh: $BIN not found: run ./setup.sh first" >&2
  exit 1
fi
mkdir -p "$WORK"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
echo "== fp4moe serve --model $MODEL --backend cpu --port $PORT (log: $WORK/serve.log)"
"$BIN" serve --model "$MODEL" --backend cpu --port "$PORT" --served-model-name "$NAME" --tool-call-parser glm47 \
  >"$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  python3 -c "import urllib.request, sys; urllib.request.urlopen('$URL/health', timeout=1)" 2>/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; echo "demo.sh: the server exited" >&2; exit 1; }
  sleep 0.1
done
grep -m1 "serving" "$WORK/serve.log" || head -n 3 "$WORK/serve.log"

echo "== POST $URL/v1/chat/completions (openai client)"
python3 - "$URL" <<'PY'
import sys
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
r = client.chat.completions.create(model="glm5-mini-py", max_tokens=96, temperature=0,
                                   messages=[{"role": "user", "content": "Tests for the json module."}])
print(r.model_dump_json(indent=2, exclude_none=True))
assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
print("---- the reply's content, as text ----")
print(r.choices[0].message.content)
print("--------------------------------------")
PY

echo "== a tool-call request (tools rendered by the chat template; --tool-call-parser glm47 reads the reply)"
python3 - "$URL" <<'PY'
import json, sys, urllib.request
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                         "required": ["city", "days"]}}}]
r = client.chat.completions.create(model="glm5-mini-py", max_tokens=16, temperature=0, tools=tools,
                                   messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}])
m = r.choices[0].message
print(f"finish_reason={r.choices[0].finish_reason} tool_calls={m.tool_calls} content={m.content!r}")
print("(a model trained on Python sources writes no call; what the parser makes of a GLM-4.7 call, via POST /parse_function_call:)")
text = "Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
req = urllib.request.Request(sys.argv[1] + "/parse_function_call", method="POST",
                             data=json.dumps({"text": text, "tool_call_parser": "glm47", "tools": tools}).encode(),
                             headers={"Content-Type": "application/json"})
print(json.dumps(json.load(urllib.request.urlopen(req)), ensure_ascii=False))
print("(the same request with tool_choice naming the function: the output is held to the GLM-4.7 call format")
print(" and the tool's argument schema, so even this model writes a call the parser reads back:)")
r = client.chat.completions.create(model="glm5-mini-py", max_tokens=256, temperature=0, tools=tools,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}])
c = r.choices[0]
print(f"finish_reason={c.finish_reason} tool_calls={[(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]}")
assert c.finish_reason in ("tool_calls", "length")
print("== structured output: response_format json_schema (the reply is JSON that validates)")
schema = {"type": "object", "properties": {"module": {"type": "string", "maxLength": 24},
          "functions": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3}},
          "required": ["module", "functions"], "additionalProperties": False}
r = client.chat.completions.create(model="glm5-mini-py", max_tokens=96, temperature=0,
                                   response_format={"type": "json_schema", "json_schema": {"name": "summary", "schema": schema, "strict": True}},
                                   messages=[{"role": "user", "content": "Helpers for the json module."}])
c = r.choices[0]
print(f"finish_reason={c.finish_reason} content={c.message.content}")
if c.finish_reason == "stop":
    print("parsed:", json.loads(c.message.content))
PY

echo "== fp4moe bench serve (16 random prompts of 64 tokens, 32 output tokens, 4 at a time)"
"$BIN" bench serve --base-url "$URL" --num-prompts 16 --random-input-len 64 --random-output-len 32 \
  --random-range-ratio 1.0 --max-concurrency 4 --output-file "$WORK/bench_serve.jsonl"

echo "== SIGTERM"
kill -TERM "$SERVER"
rc=0; wait "$SERVER" || rc=$?
trap - EXIT
echo "server exited with $rc"
exit "$rc"
