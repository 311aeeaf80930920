#!/usr/bin/env bash
# The main job on the embedded default backend (CPU): serve a small random GLM-5-architecture
# NVFP4 model and answer a real chat request through the OpenAI API.
#   1. fp4moe make-synthetic: a random GLM-5-shaped checkpoint (ModelOpt NVFP4 layout, glm5-tiny)
#   2. a small byte-level BPE tokenizer (tests/text/data/behaviors, 800 ids) and a chat template
#   3. fp4moe serve --backend cpu on a free local port (its start-up line says what was loaded)
#   4. one chat completion with the openai client, one with tools (and the tool-call parser on a
#      GLM-4.7 call through /parse_function_call), then a short fp4moe bench serve run
#   5. SIGTERM: the server drains and exits 0
# The weights are random, so the reply is random tokens of the tokenizer: the point is the
# path (HTTP -> tokenizer -> scheduler -> the model's forward step on the CPU -> detokenizer).
#   ./demo.sh              uses build/bin/fp4moe (./setup.sh builds it) and /tmp/fp4moe-demo
# Environment: BUILD_DIR (default build), FP4MOE_DEMO_DIR (default /tmp/fp4moe-demo).
set -euo pipefail
cd "$(dirname "$0")"
BIN=${BUILD_DIR:-build}/bin/fp4moe
WORK=${FP4MOE_DEMO_DIR:-/tmp/fp4moe-demo}
MODEL=$WORK/glm5-tiny
if [ ! -x "$BIN" ]; then
  echo "demo.sh: $BIN not found: run ./setup.sh first" >&2
  exit 1
fi
mkdir -p "$WORK"
echo "== fp4moe make-synthetic $MODEL --preset glm5-tiny"
"$BIN" make-synthetic "$MODEL" --preset glm5-tiny --seed 0
cp tests/text/data/behaviors/tokenizer.json "$MODEL/"
printf '%s' '{% if tools %}<|system|>Tools:{% for t in tools %} {{ t.function | tojson }}{% endfor %}{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}' \
  > "$MODEL/chat_template.jinja"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
echo "== fp4moe serve --model $MODEL --backend cpu --port $PORT (log: $WORK/serve.log)"
"$BIN" serve --model "$MODEL" --backend cpu --port "$PORT" --served-model-name glm5-tiny --tool-call-parser glm47 \
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
r = client.chat.completions.create(model="glm5-tiny", max_tokens=24, temperature=0,
                                   messages=[{"role": "user", "content": "Hello! What is an FP4 expert?"}])
print(r.model_dump_json(indent=2, exclude_none=True))
assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
PY

echo "== a tool-call request (tools rendered by the chat template; --tool-call-parser glm47 reads the reply)"
python3 - "$URL" <<'PY'
import json, sys, urllib.request
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
r = client.chat.completions.create(model="glm5-tiny", max_tokens=16, temperature=0, tools=tools,
                                   messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}])
m = r.choices[0].message
print(f"finish_reason={r.choices[0].finish_reason} tool_calls={m.tool_calls} content={m.content!r}")
print("(random weights write no call; what the parser makes of a GLM-4.7 call, via POST /parse_function_call:)")
text = "Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
req = urllib.request.Request(sys.argv[1] + "/parse_function_call", method="POST",
                             data=json.dumps({"text": text, "tool_call_parser": "glm47", "tools": tools}).encode(),
                             headers={"Content-Type": "application/json"})
print(json.dumps(json.load(urllib.request.urlopen(req)), ensure_ascii=False))
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
