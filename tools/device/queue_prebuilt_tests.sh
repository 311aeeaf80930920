#!/usr/bin/env bash
# One device call without the build: the GPU test binaries carried in .pre/ (pack_prebuilt.sh
# here), each whole, with a per-binary time limit; prints rc and the gtest summary per binary.
#   carry [".pre"]; bash tools/device/queue_prebuilt_tests.sh [binary ...]
# (default: every *_test carried). Logs under $OUT/prebuilt_tests/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/prebuilt_tests; mkdir -p "$O"
source tools/device/prebuilt_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "binaries of commit $FP4MOE_COMMIT"
tests=("$@")
[ ${#tests[@]} -gt 0 ] || for b in "$PRE_BIN"/*_test; do tests+=("$(basename "$b")"); done
rc=0
for t in "${tests[@]}"; do
  t0=$(date +%s)
  (cd /tmp && timeout "${TEST_LIMIT_S:-240}" "$PRE_BIN/$t") > "$O/$t.log" 2>&1
  r=$?; [ $r -eq 0 ] || rc=1
  echo "$t: rc=$r in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$O/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure$|SKIPPED \]' "$O/$t.log" | head -n 12
done
exit $rc
