#!/usr/bin/env bash
# Device step: the PyTorch baseline server (bench/torch_serve) on the GPU, on a glm5-layer model
# (GLM-5 dims, NVFP4 experts dequantized to BF16 at load) with few layers.
#   1. `fp4moe make-synthetic --preset glm5-layer --layers $TS_LAYERS --dense-layers $TS_DENSE`
#      into $TS_MODEL (kept between calls while the machine is warm; ~10 GB for 2 layers);
#   2. start serve.py, wait for the "serving" line (load + warm-up), log GPU memory;
#   3. requests: /health, /v1/models, one non-streaming and one streaming completion of a
#      $TS_IN-token id prompt, then $TS_CONC concurrent streaming requests ($TS_IN in / $TS_OUT out),
#      reported as a '|' table row (every request must succeed);
#   4. `fp4moe bench serve` against it when the binary has that command (short run).
# Env: TS_MODEL (default /tmp/fp4moe_glm5_L${TS_LAYERS}), TS_LAYERS (2), TS_DENSE (1), TS_CAP (64:
# --max-running-requests), TS_STEPS (1: --num-continuous-decode-steps), TS_CONC (32), TS_IN (1024), TS_OUT (128).
# Expected run time: make-synthetic a few minutes the first time, load ~1 min, requests ~1-2 min.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; O=$OUT/torch_serve; mkdir -p "$O"
L=${TS_LAYERS:-2}; D=${TS_DENSE:-1}; CAP=${TS_CAP:-64}; STEPS=${TS_STEPS:-1}; CONC=${TS_CONC:-32}; NOUT=${TS_OUT:-128}; NIN=${TS_IN:-1024}
MODEL=${TS_MODEL:-/tmp/fp4moe_glm5_L$L}
PORT=${TS_PORT:-30077}
rc=0
if [ ! -f "$MODEL/config.json" ]; then
  [ -x build-dev/bin/fp4moe ] || bash tools/device/build.sh fp4moe > "$O/build_fp4moe.log" 2>&1
  t0=$(date +%s)
  timeout 420 build-dev/bin/fp4moe make-synthetic "$MODEL" --preset glm5-layer --layers "$L" --dense-layers "$D" \
    > "$O/make_synthetic.log" 2>&1
  r=$?; echo "make-synthetic glm5-layer L=$L D=$D: rc=$r in $(( $(date +%s) - t0 )) s"
  [ $r -eq 0 ] || { rm -rf "$MODEL"; tail -n 5 "$O/make_synthetic.log"; exit 1; }
fi
python3 -c 'import torch, safetensors; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'

python3 bench/torch_serve/serve.py --model "$MODEL" --port "$PORT" --max-running-requests "$CAP" \
  --num-continuous-decode-steps "$STEPS" > "$O/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
t0=$(date +%s)
until grep -q "serving '" "$O/server.log"; do
  if ! kill -0 $SERVER 2>/dev/null || [ $(( $(date +%s) - t0 )) -gt 400 ]; then
    echo "server did not start:"; tail -n 20 "$O/server.log"; exit 1
  fi
  sleep 2
done
echo "server up in $(( $(date +%s) - t0 )) s:"; grep -E 'loaded in|layers \(' "$O/server.log"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader

timeout 300 python3 - "$PORT" "$CONC" "$NIN" "$NOUT" "$CAP" "$STEPS" "$L" <<'EOF' 2>&1 | tee "$O/requests.log"
import http.client, json, random, sys, threading, time
port, conc, nin, nout, cap, steps, layers = (int(x) for x in sys.argv[1:])
def call(body, stream):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=stream)), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        return r.status, json.loads(r.read()), time.time() - t0, None
    ttft, n, usage = None, 0, None
    for line in r:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            usage = j["usage"]
        if j.get("choices") and j["choices"][0].get("text"):
            n += 1
            ttft = ttft or time.time() - t0
    return r.status, {"tokens": n, "usage": usage}, time.time() - t0, ttft
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/v1/models"); models = json.loads(c.getresponse().read())
c.request("GET", "/get_model_info"); vocab = json.loads(c.getresponse().read())["vocab_size"]
print("models:", [m["id"] for m in models["data"]], "vocab", vocab)
rng = random.Random(1)
prompt = lambda: [rng.randrange(vocab) for _ in range(nin)]
body = {"prompt": prompt(), "max_tokens": 16, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
s, j, dt, _ = call(body, False)
print(f"non-streaming: HTTP {s}, {j['usage']}, {dt:.2f} s, ids {j['choices'][0]['token_ids'][:8]}...")
ok = s == 200 and j["usage"]["completion_tokens"] == 16
s2, j2, dt2, ttft = call(dict(body, stream_options={"include_usage": True}), True)
print(f"streaming: HTTP {s2}, {j2['tokens']} chunks, usage {j2['usage']}, TTFT {ttft:.3f} s, {dt2:.2f} s")
ok = ok and s2 == 200 and j2["tokens"] == 16
results = [None] * conc
def worker(i):
    results[i] = call({"prompt": prompt(), "max_tokens": nout, "temperature": 0, "ignore_eos": True}, True)
t0 = time.time()
threads = [threading.Thread(target=worker, args=(i,)) for i in range(conc)]
[t.start() for t in threads]; [t.join() for t in threads]
dur = time.time() - t0
good = [r for r in results if r and r[0] == 200 and r[1]["tokens"] == nout]
toks = sum(r[1]["tokens"] for r in good)
ttfts = sorted(r[3] for r in good)
print(f"| torch_serve L={layers} cap={cap} steps={steps} | {conc} x {nin} in / {nout} out | {len(good)}/{conc} ok | "
      f"{toks / dur:.1f} output tok/s | TTFT median {ttfts[len(ttfts) // 2] if ttfts else float('nan'):.2f} s | {dur:.1f} s |")
c.request("GET", "/metrics"); print("metrics:", c.getresponse().read().decode())
sys.exit(0 if ok and len(good) == conc else 1)
EOF
r=${PIPESTATUS[0]}; echo "requests: rc=$r"; [ $r -eq 0 ] || rc=1

if [ -x build-dev/bin/fp4moe ] && build-dev/bin/fp4moe bench serve --help > /dev/null 2>&1; then
  timeout 300 build-dev/bin/fp4moe bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 64 \
    --random-input-len "$NIN" --random-output-len "$NOUT" --random-range-ratio 1.0 --max-concurrency "$CAP" \
    --output-file "$O/bench_serve.jsonl" 2>&1 | tee "$O/bench_serve.log"
  r=${PIPESTATUS[0]}; echo "fp4moe bench serve: rc=$r"; [ $r -eq 0 ] || rc=1
else
  echo "fp4moe bench serve: not in this build (skipped)"
fi
grep -E 'running [0-9]+, waiting|engine failed|Traceback' "$O/server.log" | tail -n 5
exit $rc
