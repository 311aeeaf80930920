#!/usr/bin/env bash
# One device call for issue 38's performance check: `bench step` (13 layers of the GLM-5-dims
# model, ctx 1K, B 1 / 8 / 64 / 256, prefill 4K, K 1 / 8) with the binary of the commit before the
# restructuring (BEFORE_BIN, carried prebuilt: .pre-<commit>) and the one of now (AFTER_BIN,
# build-dev/bin/fp4moe), alternated A B A B on the same machine so clock drift falls on both;
# then bench/compare_bench_step.py prints the after / before table (ms per step, prefill ms,
# start-up seconds). The model is /tmp/glm5-runner (made by queue_memplan.sh or here). Then one
# `bench serve` cell per side (BA_SERVE=0 skips it).
#   BEFORE_BIN=/tmp/fp4moe_pre/fp4moe BEFORE_LIB=.pre-c8f0d99/lib bash tools/device/queue_before_after.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/before_after; mkdir -p "$O"
A=${BEFORE_BIN:?BEFORE_BIN: the fp4moe of the commit before}
B=${AFTER_BIN:-build-dev/bin/fp4moe}
M=${BA_MODEL_DIR:-/tmp/glm5-runner}
REPS=${BA_REPS:-2}
if [ ! -f "$M/config.json" ]; then
  t0=$(date +%s)
  timeout 400 "$B" make-synthetic "$M" --preset glm5-layer --layers 5 --dense-layers 3 > "$O/make_synthetic.log" 2>&1
  echo "make-synthetic: rc=$? in $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
ARGS=(bench step --model "$M" --replicate-layers 13 --batch ${BA_BATCH:-1,8,64,256} --ctx 1024 --prefill 4096 --k 1,8
      --iters ${BA_ITERS:-20})
rc=0
for r in $(seq 1 "$REPS"); do
  for side in before after; do
    bin=$A; lib=${BEFORE_LIB:-}
    [ $side = after ] && bin=$B && lib=
    t0=$(date +%s)
    LD_LIBRARY_PATH="${lib:+$PWD/$lib:}${LD_LIBRARY_PATH:-}" timeout 200 "$bin" "${ARGS[@]}" --json "$O/${side}_$r.json" \
      > "$O/${side}_$r.log" 2> "$O/${side}_$r.err"
    x=$?; echo "$side run $r: rc=$x in $(( $(date +%s) - t0 )) s"; [ $x -eq 0 ] || rc=1
    grep -E 'start-up|fp4moe:|error' "$O/${side}_$r.err" | cut -c1-400 | head -n 4
  done
done
# One `bench serve` cell per side (the issue's 1K / 1K, cap 1024, K 8) on the same model (serve
# loads its 5 layers: 3 dense + 2 MoE), through bench/serve_sweep.py (one wave of 1024 prompts).
if [ "${BA_SERVE:-1}" = 1 ]; then
  for side in before after; do
    bin=$A; lib=${BEFORE_LIB:-}
    [ $side = after ] && bin=$B && lib=
    t0=$(date +%s)
    LD_LIBRARY_PATH="${lib:+$PWD/$lib:}${LD_LIBRARY_PATH:-}" timeout 240 python3 bench/serve_sweep.py --fp4moe "$bin" \
      --model "$M" --out "$O/serve_$side" --input-len 1024 --output-len 1024 --caps 1024 --steps 8 --no-torch \
      --no-fake-ceiling --budget-s 220 --serve-args "--chunked-prefill-size 8192 --context-length 4096" \
      > "$O/serve_$side.log" 2>&1
    x=$?; echo "serve cell $side: rc=$x in $(( $(date +%s) - t0 )) s"; [ $x -eq 0 ] || rc=1
    grep -E 'healthy|tok/s|output_throughput|failed|error' "$O/serve_$side.log" | cut -c1-300 | tail -n 6
    [ -f "$O/serve_$side/summary.json" ] && python3 bench/serve_sweep_report.py --no-plots "$O/serve_$side/summary.json" 2>&1 | grep '^|'
  done
fi
python3 bench/compare_bench_step.py --before "$O"/before_*.json --after "$O"/after_*.json \
  --before-logs "$O"/before_*.log --after-logs "$O"/after_*.log | tee "$O/compare.md"
exit $rc
