#!/usr/bin/env bash
# Device step (tools/device/run_all.sh runs it after the build): the MoE grouped GEMM
# benchmark with its baselines, same shapes and routing counts in one call:
#   1. bench/torch_grouped_mm.py      -> $OUT/torch_grouped_mm.json
#   2. fp4moe bench gemm --torch-json -> $OUT/bench_gemm.json (+ table on stdout)
#   3. bench/plot_gemm.py             -> $OUT/bench_gemm.png
# Env: TOKENS (default all of 1..16384), CONFIGS (all|best), ITERS.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
TOKENS=${TOKENS:-1,8,32,128,512,2048,8192,16384}
CONFIGS=${CONFIGS:-all}
ITERS=${ITERS:-20}
BIN=build-dev/bin/fp4moe
[ -x "$BIN" ] || bash tools/device/build.sh fp4moe || exit 1
export FP4MOE_COMMIT=${FP4MOE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
rc=0
PYTHONUNBUFFERED=1 timeout 240 python3 bench/torch_grouped_mm.py --json "$OUT/torch_grouped_mm.json" \
  --tokens "$TOKENS" --iters "$ITERS" || { echo "torch baseline failed (rc=$?)"; rc=1; }
torch_arg=()
[ -s "$OUT/torch_grouped_mm.json" ] && torch_arg=(--torch-json "$OUT/torch_grouped_mm.json")
timeout 300 "$BIN" bench gemm --op both --tokens "$TOKENS" --configs "$CONFIGS" --iters "$ITERS" \
  --json "$OUT/bench_gemm.json" "${torch_arg[@]}" || { echo "fp4moe bench gemm failed (rc=$?)"; rc=1; }
[ -s "$OUT/bench_gemm.json" ] && { python3 bench/plot_gemm.py "$OUT/bench_gemm.json" "$OUT/bench_gemm.png" || rc=1; }
exit $rc
