#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): the decode step's small row kernels
# (src/cuda/norm, sampling/argmax_f32, embed, rope; issue 43).
#   1. backend_ops_test's small rows of these ops under compute-sanitizer memcheck and racecheck (the
#      argmax's split form: a last-CTA merge through its workspace), then the whole
#      backend_ops_test (every row == the CPU reference) and backend_ops_emu_test;
#   2. `fp4moe bench rows` (rows 1 / 8 / 64 / 256; previous form v0 against the present one,
#      warm and cold L2, beside the byte floor); table rows start with '|'.
# Expected run time: ~1 min tests + ~1 min bench. Env: ROWS_BENCH_ARGS (extra bench flags).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/rows"
O=$OUT/rows
TESTS="backend_ops_test backend_ops_emu_test"
for t in $TESTS fp4moe; do [ -x build-dev/bin/$t ] || bash tools/device/build.sh $t > "$O/build_$t.log" 2>&1; done
rc=0
F='*rms_norm*:*argmax*:*embed*:*gather*:*rope*:-*big_*'  # the sanitizers take the small rows (GLM-5's b1 / b2 / b7 among them)
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build-dev/bin/backend_ops_test --gtest_filter="$F" \
    > "$O/backend_ops_$tool.log" 2>&1
  r=$?; echo "backend_ops_test $tool: rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/backend_ops_$tool.log" | tail -n 1)"
  [ $r -eq 0 ] || rc=1
done
for t in $TESTS; do
  B=build-dev/bin/$t
  [ -x "$B" ] || { echo "$t: not built"; rc=1; continue; }
  timeout 300 "$B" > "$O/${t}.log" 2>&1
  r=$?; echo "$t: rc=$r $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$O/${t}.log" | tr '\n' ' ')"; [ $r -eq 0 ] || rc=1
  grep -E '^\[  FAILED  \]|Failure' "$O/${t}.log" | head -n 30
done
timeout 300 build-dev/bin/fp4moe bench rows ${ROWS_BENCH_ARGS:-} 2>&1 | tee "$O/bench_rows.log"
r=${PIPESTATUS[0]}; echo "bench rows: rc=$r"; [ $r -eq 0 ] || rc=1
exit $rc
