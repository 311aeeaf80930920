#!/usr/bin/env bash
# Issue 40 item 4 on the GPU: long context end to end through the server — `bench serve` with
# random prompts of LONG_IN (32768) tokens, LONG_OUT (512) out, concurrency 1 and 8, with the BF16
# and the FP8 E4M3 KV cache, on a GLM-5-dims checkpoint (the 5-layer one of queue_memplan.sh:
# make-synthetic --preset glm5-layer --layers 5 --dense-layers 3, made when $LONG_MODEL is
# missing, ~2 min). Each side: the server's start-up plan line, TTFT / TPOT / output tok/s per
# concurrency, and no raw CUDA allocation error in its log. Binaries: $PRE_BIN or build-dev/bin.
#   LONG_KV="bf16 fp8_e4m3" LONG_CONC="1 8" picks the cells; LONG_LIMIT_S caps the whole run
#   (LONG_BACKEND=cpu LONG_MODEL=models/glm5-mini-py LONG_IN=512 LONG_OUT=16: a check of the script here).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/longctx; mkdir -p "$O"
BD=${PRE_BIN:-build-dev/bin}; M=${LONG_MODEL:-/tmp/glm5-runner}
IN=${LONG_IN:-32768}; OUTL=${LONG_OUT:-512}; T0=$(date +%s); END=$(( T0 + ${LONG_LIMIT_S:-540} ))
if [ ! -f "$M/config.json" ]; then
  timeout 300 "$BD/fp4moe" make-synthetic "$M" --preset glm5-layer --layers 5 --dense-layers 3 > "$O/make_synthetic.log" 2>&1
  echo "make-synthetic: rc=$? at $(( $(date +%s) - T0 )) s"
fi
rc=0
for kv in ${LONG_KV:-bf16 fp8_e4m3}; do
  [ $(( END - $(date +%s) )) -lt 60 ] && { echo "kv $kv: skipped (time)"; continue; }
  "$BD/fp4moe" serve --model "$M" --backend "${LONG_BACKEND:-cuda}" --port 30130 --kv-cache-dtype "$kv" \
    --context-length $(( IN + OUTL + 64 )) --max-running-requests 8 > "$O/serve_$kv.log" 2>&1 &
  pid=$!
  for t in $(seq 1 240); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30130/health', timeout=2)" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break; sleep 0.5
  done
  grep -E 'memory plan|fp4moe:' "$O/serve_$kv.log" | head -2 | cut -c1-420
  for c in ${LONG_CONC:-1 8}; do
    left=$(( END - $(date +%s) - 15 )); [ $left -lt 30 ] && { echo "[$kv c $c] skipped (time)"; continue; }
    n=$(( c * 2 ))
    timeout $left "$BD/fp4moe" bench serve --port 30130 --random-input-len $IN --random-output-len $OUTL \
      --random-range-ratio 1.0 --num-prompts $n --max-concurrency $c --warmup-requests 0 --disable-progress \
      --output-file "$O/bench_$kv.jsonl" > "$O/bench_${kv}_c$c.log" 2>&1
    r=$?; [ $r -eq 0 ] || rc=1
    echo "[$kv c $c] rc=$r $(python3 -c "
import json; d=[json.loads(l) for l in open('$O/bench_$kv.jsonl')][-1]
print('%d prompts of %d in / %d out: output tok/s %.0f, TTFT median %.0f ms, TPOT median %.2f ms, completed %s' % (d.get('num_prompts', 0) or $n, $IN, $OUTL, d.get('output_throughput', 0), d.get('median_ttft_ms', 0), d.get('median_tpot_ms', 0), d.get('completed')))" 2>&1)"
  done
  kill $pid; wait $pid 2>/dev/null
  if grep -q cudaErrorMemoryAllocation "$O/serve_$kv.log"; then echo "RAW CUDA OOM in serve ($kv): a bug"; rc=1; fi
done
exit $rc
