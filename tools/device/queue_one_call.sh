#!/usr/bin/env bash
# Everything issue 38 needs from the GPU in ONE device call, for sessions where machines rarely
# start: carry [".pre"] packed with fp4moe, the test binaries and the "before" fp4moe as
# .pre/before_fp4moe.xz (the commit before the restructuring; its COMMIT in .pre/BEFORE_COMMIT).
#   1. the 13-layer bench model (make-synthetic) in the background, while the GPU tests carried
#      run in two lanes (queue_prebuilt_tests.sh, TEST_LIMIT_S each);
#   2. queue_before_after.sh (bench step before / after, then one bench serve cell per side),
#      with BA_REPS (default 1) — each part only when the call's time left allows it.
#   bash tools/device/queue_one_call.sh [test binary ...]
# (a short call: MAKE_MODEL=0 and a CALL_LIMIT_S under 300 runs the tests only).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s); END=$(( T0 + ${CALL_LIMIT_S:-570} ))
OUT=${OUT:-$PWD/out}; export OUT
tests=("$@")
MAKE_MODEL=${MAKE_MODEL:-1} TEST_LANES=${TEST_LANES:-2} TEST_LIMIT_S=${TEST_LIMIT_S:-180} bash tools/device/queue_prebuilt_tests.sh "${tests[@]}"
echo "tests: rc=$? at $(( $(date +%s) - T0 )) s"
source tools/device/prebuilt_env.sh
[ -x "$PRE_BIN/before_fp4moe" ] || { echo "no before_fp4moe carried"; exit 1; }
left=$(( END - $(date +%s) ))
echo "before/after: ${left} s left (before = $(cat .pre/BEFORE_COMMIT 2>/dev/null), after = $FP4MOE_COMMIT)"
if [ $left -gt 150 ]; then
  serve=1; [ $left -lt 330 ] && serve=0
  BEFORE_BIN=$PRE_BIN/before_fp4moe AFTER_BIN=$PRE_BIN/fp4moe BA_REPS=${BA_REPS:-1} BA_SERVE=${BA_SERVE:-$serve} \
    timeout $(( left - 10 )) bash tools/device/queue_before_after.sh
  echo "before/after: rc=$? at $(( $(date +%s) - T0 )) s"
fi
