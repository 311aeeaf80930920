#!/usr/bin/env bash
# Issue 39 on the GPU with the small trained model (models/glm5-mini-py, in the tree): MTP
# speculation's accept length and its real speed-up, plain vs --speculative-algorithm NEXTN
# (--speculative-num-steps ${SPEC_N:-3}) on --backend cuda:
#   1. generate, greedy, 3 Python prompts x 256 tokens: the tokens (plain == NEXTN: lossless),
#      the accept length and tok/s from each run's last lines;
#   2. serve + bench serve at concurrency 1 / 16 / 64 (prompts ~1K tokens of the machine's own
#      CPython sources, 256 out, ignore_eos), each side in turn; /metrics' accept counters.
# Binaries: $PRE_BIN (tools/device/prebuilt_env.sh) or build-dev/bin.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/mini_spec; mkdir -p "$O"
BD=${PRE_BIN:-build-dev/bin}; M=models/glm5-mini-py; N=${SPEC_N:-3}
B=${SPEC_BACKEND:-cuda}; T=${SPEC_TOKENS:-256}; CONC=${SPEC_CONC:-1 16 64}
SPEC=(--speculative-algorithm NEXTN --speculative-num-steps "$N")
python3 - "$O/ds.jsonl" "$T" <<'PY'
import glob, json, os, sys, sysconfig
src = sysconfig.get_paths()["stdlib"]
files = sorted(f for f in glob.glob(os.path.join(src, "*.py")) if os.path.getsize(f) > 20000)
out = open(sys.argv[1], "w"); n = 0
for f in files:
    t = open(f, encoding="utf-8", errors="replace").read()
    for i in range(0, len(t) - 4000, 4000):
        out.write(json.dumps({"prompt": t[i:i + 3500], "output_len": int(sys.argv[2])}) + "\n"); n += 1
        if n >= 400: break
    if n >= 400: break
print(f"dataset: {n} prompts of 3500 characters from {src}")
PY
rc=0; i=0
for k in 0 1 2; do
  prompt=$(python3 -c "print(['def parse_args(argv):\n    ', 'class LRUCache:\n    def __init__(self, size):\n        ', 'import os\nimport sys\n\n\ndef main():\n    '][$k], end='')")
  for side in plain spec; do
    extra=(); [ $side = spec ] && extra=("${SPEC[@]}")
    timeout 120 "$BD/fp4moe" generate --model "$M" --backend "$B" --prompt "$prompt" --max-new-tokens "$T" "${extra[@]}" \
      > "$O/gen_${k}_$side.out" 2> "$O/gen_${k}_$side.err"
    r=$?; [ $r -eq 0 ] || { rc=1; echo "generate $k $side: rc=$r"; tail -3 "$O/gen_${k}_$side.err"; }
    grep -E 'speculative NEXTN|decode:' "$O/gen_${k}_$side.err" | sed "s/^/  [$k $side] /" | cut -c1-330
  done
  if [ -s "$O/gen_${k}_plain.out" ] && cmp -s "$O/gen_${k}_plain.out" "$O/gen_${k}_spec.out"; then
    echo "prompt $k: NEXTN $N text identical to plain greedy (lossless)"
  else echo "prompt $k: NEXTN $N TEXT DIFFERS from plain greedy"; rc=1; fi
done
head -c 600 "$O/gen_0_spec.out"; echo
# The FP8 KV cache (issue 40) on the trained model: greedy text against the BF16 cache's.
timeout 120 "$BD/fp4moe" generate --model "$M" --backend "$B" --prompt "$prompt" --max-new-tokens "$T" \
  --kv-cache-dtype fp8_e4m3 > "$O/gen_fp8.out" 2> "$O/gen_fp8.err"
echo "generate --kv-cache-dtype fp8_e4m3: rc=$? $(grep -oE 'KV pool[^;]*' "$O/gen_fp8.err" | head -1)"
python3 -c "
a=open('$O/gen_2_plain.out').read(); b=open('$O/gen_fp8.out').read(); n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), min(len(a),len(b)))
print(f'fp8 vs bf16 KV greedy text: the first {n} of {len(a)} characters equal')"
# Sides of the serve part (SPEC_SIDES): plain, spec (NEXTN), specoff (NEXTN with
# --speculative-disable-by-batch-size SPEC_OFF_N, default 8: plain rounds above it), fp8 (FP8 KV).
for side in ${SPEC_SIDES:-plain spec specoff fp8}; do
  extra=(); [ $side = spec ] && extra=("${SPEC[@]}"); [ $side = fp8 ] && extra=(--kv-cache-dtype fp8_e4m3)
  [ $side = specoff ] && extra=("${SPEC[@]}" --speculative-disable-by-batch-size "${SPEC_OFF_N:-8}")
  "$BD/fp4moe" serve --model "$M" --backend "$B" --port 30123 --max-running-requests 64 "${extra[@]}" \
    > "$O/serve_$side.log" 2>&1 &
  pid=$!
  for t in $(seq 1 120); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30123/health', timeout=2)" 2>/dev/null && break; sleep 0.5; done
  grep -E 'memory plan|gpu runner' "$O/serve_$side.log" | head -2 | cut -c1-300
  conc=$CONC; [ $side = fp8 ] && conc=16
  for c in $conc; do
    n=$(( c * 4 )); [ $n -lt 8 ] && n=8
    timeout 200 "$BD/fp4moe" bench serve --port 30123 --dataset-name jsonl --dataset-path "$O/ds.jsonl" --num-prompts $n \
      --max-concurrency $c --output-file "$O/bench_$side.jsonl" --disable-progress > "$O/bench_${side}_c$c.log" 2>&1
    echo "[$side c $c] rc=$? $(python3 -c "
import json; d=[json.loads(l) for l in open('$O/bench_$side.jsonl')][-1]
print('output tok/s %.0f, TPOT median %.2f ms, completed %s' % (d.get('output_throughput',0), d.get('median_tpot_ms',0), d.get('completed')))" 2>&1)"
  done
  python3 tools/device/structured_check.py 30123 3 2>&1 | tail -8
  python3 -c "import urllib.request; print(''.join(l for l in urllib.request.urlopen('http://127.0.0.1:30123/metrics').read().decode().splitlines(True) if l.startswith('fp4moe_spec') and '_bucket' not in l))" 2>&1 | head -8
  kill $pid; wait $pid 2>/dev/null
done
exit $rc
