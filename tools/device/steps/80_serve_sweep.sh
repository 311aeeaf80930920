#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): issue 17's experiment on the H200.
#   NO_TESTS=1 bash tools/device/run_all.sh 80_serve_sweep
# 1. A GLM-5-dims model of SWEEP_LAYERS layers (SWEEP_DENSE dense; default 2 / 1: one MoE layer,
#    ~10 GB on disk) with `fp4moe make-synthetic --preset glm5-layer` (NVFP4 experts, BF16
#    attention / shared expert / lm_head, random weights), kept in SWEEP_MODEL between calls.
#    Both servers load this same model (the BF16 baseline holds at most ~4 MoE layers).
# 2. bench/serve_sweep.py: `fp4moe serve --backend $SWEEP_BACKEND` over --max-running-requests
#    SWEEP_CAPS x --num-continuous-decode-steps SWEEP_STEPS, and bench/torch_serve at
#    SWEEP_TORCH_STEPS (K = 1) over the same caps, each cell measured by `fp4moe bench serve`
#    (random ids, exact lengths, ignore_eos, request rate inf, max concurrency = the cap).
#    Servers: one per K, started with the largest cap; each cell's cap is the client's
#    --max-concurrency, so the running set never exceeds it (and nothing queues in the server).
#    Restarting per cell would spend ~20 s of load x 20 cells, more than the budget. Order:
#    fp4moe at the first K, the baseline, then fp4moe at the other Ks (1, torch, 8, 4, 2), caps
#    ascending; a cell that does not fit the time left is recorded as skipped (with the reason),
#    one that runs past it is killed and recorded as such.
#    Last, with the budget left: `serve --backend fake` (no model time) at the largest cap, the
#    HTTP + scheduler path's own ceiling (SWEEP_FAKE_CEILING=0 skips it).
# 3. bench/serve_sweep_report.py: the markdown table (printed: run_all's summary shows it).
#    A sweep that needs more than one call (1K / 1K: ~25 min for every fp4moe cell and the
#    baseline at caps 16 / 64; 2026-12-04 ran it in four calls with SWEEP_STEPS / SWEEP_CAPS /
#    SWEEP_TORCH_* per call, SWEEP_PROMPTS_FACTOR=1 SWEEP_MIN_PROMPTS=16) is reported here after
#    the calls: bench/serve_sweep_report.py A/summary.json B/summary.json ... merges them.
#
# The reduction (the device budget is ~30 min of GPU for the whole session): the seed runs
# 1K in / 1K out with enough prompts to saturate; the default here is SWEEP_IN=64 in /
# SWEEP_OUT=64 out, SWEEP_PROMPTS_FACTOR=2 x cap prompts (two waves; at least SWEEP_MIN_PROMPTS=64;
# one wave of cap prompts where 2 x cap > SWEEP_MAX_PROMPTS=1024, i.e. caps 1024 and 2048), which
# the report states. Estimate (H200, 1 dense + 1 MoE layer): make-synthetic < 1 min, fp4moe
# start-up ~15 s x 4, the baseline's ~45 s, ~40 s of cells per K and ~80 s for the baseline:
# ~6.5 min. 128 / 128 would need ~10 min.
# Budget: SWEEP_BUDGET_S (default 450) from this step's start, model creation included, and never
# past SWEEP_CALL_LIMIT_S (default 540) after run_all.sh started (FP4MOE_CALL_T0), so one device
# call of build-kept + this step stays under 9 minutes.
# Env: SWEEP_BACKEND (cuda), SWEEP_PRESET (glm5-layer), SWEEP_LAYERS (2), SWEEP_DENSE (1),
# SWEEP_MODEL (/tmp/fp4moe_glm5_L$LAYERS, the same as 72_torch_serve_smoke's), SWEEP_IN, SWEEP_OUT,
# SWEEP_PROMPTS_FACTOR, SWEEP_MIN_PROMPTS (64), SWEEP_MAX_PROMPTS, SWEEP_CAPS (16,64,256,1024,2048),
# SWEEP_STEPS (1,8,4,2), SWEEP_TORCH (1; 0 = no baseline), SWEEP_TORCH_CAPS (= SWEEP_CAPS),
# SWEEP_TORCH_STEPS (1), SWEEP_SERVE_ARGS (--chunked-prefill-size 8192 --context-length 4096),
# SWEEP_TORCH_ARGS, SWEEP_BUDGET_S, SWEEP_CALL_LIMIT_S.
# Look for: "cells ok" in the log, every cell "ok" with 0 failed requests, the start-up lines
# (memory plan), tokens per expert rising with the cap, and the '|' table.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; O=$OUT/serve_sweep; mkdir -p "$O"
T0=$(date +%s)
CALL_T0=${FP4MOE_CALL_T0:-$T0}
BUDGET=${SWEEP_BUDGET_S:-450}
END=$(( T0 + BUDGET )); CALL_END=$(( CALL_T0 + ${SWEEP_CALL_LIMIT_S:-540} ))
[ $CALL_END -lt $END ] && END=$CALL_END
BIN=${SWEEP_BIN:-build-dev/bin/fp4moe}
PRESET=${SWEEP_PRESET:-glm5-layer}; L=${SWEEP_LAYERS:-2}; D=${SWEEP_DENSE:-1}
MODEL=${SWEEP_MODEL:-/tmp/fp4moe_glm5_L$L}
[ "$PRESET" = glm5-layer ] || MODEL=${SWEEP_MODEL:-/tmp/fp4moe_${PRESET}_L$L}
[ -x "$BIN" ] || bash tools/device/build.sh fp4moe > "$O/build_fp4moe.log" 2>&1
[ -x "$BIN" ] || { echo "serve sweep: $BIN not built"; exit 1; }
ENV="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1); commit ${FP4MOE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
echo "serve sweep: $ENV; budget $(( END - T0 )) s"

if [ ! -f "$MODEL/config.json" ]; then
  t0=$(date +%s)
  timeout $(( END - t0 - 60 > 10 ? END - t0 - 60 : 10 )) "$BIN" make-synthetic "$MODEL" --preset "$PRESET" --layers "$L" \
    --dense-layers "$D" > "$O/make_synthetic.log" 2>&1
  r=$?; echo "make-synthetic $PRESET --layers $L --dense-layers $D: rc=$r in $(( $(date +%s) - t0 )) s, $(du -sh "$MODEL" 2>/dev/null | cut -f1)"
  [ $r -eq 0 ] || { rm -rf "$MODEL"; tail -n 5 "$O/make_synthetic.log"; exit 1; }
else
  echo "model: $MODEL (kept from an earlier step)"
fi

TORCH=()
[ "${SWEEP_TORCH:-1}" = 0 ] && TORCH=(--no-torch)
[ "${SWEEP_FAKE_CEILING:-1}" = 0 ] && TORCH+=(--no-fake-ceiling)
python3 bench/serve_sweep.py --fp4moe "$BIN" --model "$MODEL" --out "$O" --backend "${SWEEP_BACKEND:-cuda}" \
  --input-len "${SWEEP_IN:-64}" --output-len "${SWEEP_OUT:-64}" --caps "${SWEEP_CAPS:-16,64,256,1024,2048}" \
  --steps "${SWEEP_STEPS:-1,8,4,2}" --prompts-factor "${SWEEP_PROMPTS_FACTOR:-2}" \
  --min-prompts "${SWEEP_MIN_PROMPTS:-64}" --max-prompts "${SWEEP_MAX_PROMPTS:-1024}" \
  --budget-s $(( END - $(date +%s) )) --reserve-s "${SWEEP_RESERVE_S:-15}" \
  --start-est-s "${SWEEP_START_EST_S:-30}" --torch-start-est-s "${SWEEP_TORCH_START_EST_S:-60}" \
  --serve-args "${SWEEP_SERVE_ARGS:---chunked-prefill-size 8192 --context-length 4096}" \
  --torch-caps "${SWEEP_TORCH_CAPS:-}" --torch-steps "${SWEEP_TORCH_STEPS:-1}" --torch-args "${SWEEP_TORCH_ARGS:-}" \
  --env "$ENV" "${TORCH[@]}" 2>&1 | tee "$O/sweep.log"
rc=${PIPESTATUS[0]}
echo "serve sweep: rc=$rc in $(( $(date +%s) - T0 )) s"
python3 bench/serve_sweep_report.py "$O/summary.json" --out-dir "$O/report" --no-plots 2>&1 | tee "$O/report.log" \
  | grep -E '^\|' | head -n 40
exit $rc
