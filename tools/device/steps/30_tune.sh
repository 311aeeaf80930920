#!/usr/bin/env bash
# Device step: validate the MoE GEMM kernel path on this GPU over GLM-5 shapes: feasibility of
# every tactic, measured ranking per tokens bucket, plan cache written, one-line verdict.
# Also the sm_120 dry run (feasibility only) for the record. Run by tools/device/run_all.sh.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
BIN=build-dev/bin/fp4moe
[ -x "$BIN" ] || bash tools/device/build.sh fp4moe
"$BIN" tune --preset glm5 --arch sm_120 --act w4a4 --dry-run --json "$OUT/tune_sm120_dryrun.json" > "$OUT/tune_sm120_dryrun.txt" 2>&1
echo "sm_120 dry run: rc=$? ($(grep -c . "$OUT/tune_sm120_dryrun.txt") lines)"
# The plan goes where the MoE layer reads it (FP4MOE_PLAN_CACHE, set by run_all.sh to
# $OUT/plans.json; else the default path), so that later steps (bench moe) run with it.
timeout 480 "$BIN" tune --preset glm5 --json "$OUT/tune.json" ${FP4MOE_TUNE_TOKENS:+--tokens "$FP4MOE_TUNE_TOKENS"}
rc=$?
echo "tune: rc=$rc (plan cache: ${FP4MOE_PLAN_CACHE:-default path})"
exit $rc
