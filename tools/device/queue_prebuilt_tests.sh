#!/usr/bin/env bash
# One device call without the build: the GPU test binaries carried in .pre/ (pack_prebuilt.sh
# here), each whole, with a per-binary time limit; prints rc and the gtest summary per binary.
#   carry [".pre"]; bash tools/device/queue_prebuilt_tests.sh [binary ...]
# (default: every *_test carried). Logs under $OUT/prebuilt_tests/.
# TEST_LANES=N (default 1) runs the binaries in N lanes at once (correctness tests share the GPU
# well; never for timings). MAKE_MODEL=1 makes the 13-layer bench model (/tmp/glm5-runner, what
# queue_memplan.sh and queue_before_after.sh use) in the background meanwhile, so the next call on
# the warm machine need not.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/prebuilt_tests; mkdir -p "$O"
source tools/device/prebuilt_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "binaries of commit $FP4MOE_COMMIT"
M=${MEMPLAN_MODEL_DIR:-/tmp/glm5-runner}
if [ "${MAKE_MODEL:-0}" = 1 ] && [ ! -f "$M/config.json" ]; then
  ( t0=$(date +%s)
    timeout 420 "$PRE_BIN/fp4moe" make-synthetic "$M" --preset glm5-layer --layers 5 --dense-layers 3 > "$O/make_synthetic.log" 2>&1
    echo "make-synthetic glm5-layer --layers 5 --dense-layers 3: rc=$? in $(( $(date +%s) - t0 )) s" >> "$O/make_synthetic.log" ) &
fi
tests=("$@")
[ ${#tests[@]} -gt 0 ] || for b in "$PRE_BIN"/*_test; do tests+=("$(basename "$b")"); done
lanes=${TEST_LANES:-1}
# lane I runs tests I, I + lanes, ...; each writes its summary lines to $O/lane_I.txt.
lane() {
  local i=$1 rc=0
  for ((j = i; j < ${#tests[@]}; j += lanes)); do
    local t=${tests[$j]} t0; t0=$(date +%s)
    (cd /tmp && timeout "${TEST_LIMIT_S:-240}" "$PRE_BIN/$t") > "$O/$t.log" 2>&1
    local r=$?; [ $r -eq 0 ] || rc=1
    echo "$t: rc=$r in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$O/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure$|SKIPPED \]' "$O/$t.log" | head -n 12
  done > "$O/lane_$i.txt"
  return $rc
}
pids=()
for ((i = 0; i < lanes; i++)); do lane $i & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$O"/lane_*.txt
wait  # the model, if it is being made
[ -f "$O/make_synthetic.log" ] && tail -n 2 "$O/make_synthetic.log"
exit $rc
