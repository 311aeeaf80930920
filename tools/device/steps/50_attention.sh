#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): MLA attention, the DSA indexer and the
# KV append on the GPU.
#   1. the tiny test cases (suites *Tiny*) under compute-sanitizer memcheck (and racecheck for
#      the indexer's ring and top-k and our MLA decode kernel), then every attention / indexer /
#      append test (the *_emu_test ones run the same kernels on the CPU in CI, not here);
#   2. SASS check: the indexer kernels use the tensor cores (HMMA / QMMA-class mma.sync);
#   3. `fp4moe bench attention` (decode B x ctx dense + sparse, prefill, FP8 selection overlap),
#      table rows start with '|', JSON in $OUT/attention/bench_attention.json.
# Expected run time: ~2-3 min tests + ~3-4 min bench (< 8 min in all). Env: ATTN_PARTS (tests | bench | all, default
# all), ATTN_BENCH_ARGS (extra bench flags, e.g. "--batch 16 --ctx 8192").
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/attention"
O=$OUT/attention
TESTS="kv_append_test kv_latent_prep_test indexer_test index_key_prep_test mla_attention_test mla_prefill_expanded_test"
# Binaries: build-dev/bin, or $PRE_BIN when prebuilt ones were carried (tools/device/prebuilt_env.sh).
D=${PRE_BIN:-build-dev/bin}
for t in $TESTS fp4moe; do [ -x "$D/$t" ] || [ -n "${PRE_BIN:-}" ] || bash tools/device/build.sh $t > "$O/build_$t.log" 2>&1; done
rc=0
PARTS=${ATTN_PARTS:-all}
[ "$PARTS" = bench ] && TESTS=""
for t in $TESTS; do
  B=$D/$t
  [ -x "$B" ] || { echo "$t: not built"; rc=1; continue; }
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B" --gtest_filter='*Tiny*' > "$O/${t}_memcheck.log" 2>&1
  r=$?; echo "$t memcheck (tiny): rc=$r $(grep -E 'ERROR SUMMARY' "$O/${t}_memcheck.log" | tail -n 1)"; [ $r -eq 0 ] || rc=1
  timeout 300 "$B" > "$O/${t}.log" 2>&1
  r=$?; echo "$t: rc=$r $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$O/${t}.log" | tr '\n' ' ')"; [ $r -eq 0 ] || rc=1
  grep -E '^\[  FAILED  \]' "$O/${t}.log" | head -n 20
done
if [ "$PARTS" != bench ]; then
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $D/indexer_test --gtest_filter='IndexerTiny.*' \
    > "$O/indexer_racecheck.log" 2>&1
  r=$?; echo "indexer racecheck (tiny): rc=$r $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$O/indexer_racecheck.log" | tail -n 1)"
  [ $r -eq 0 ] || rc=1
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $D/mla_attention_test \
    --gtest_filter='MlaDecodeMmaTiny.*' > "$O/mla_decode_racecheck.log" 2>&1
  r=$?; echo "mla decode (mma) racecheck (tiny): rc=$r $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$O/mla_decode_racecheck.log" | tail -n 1)"
  [ $r -eq 0 ] || rc=1
fi
grep -h "FP8 selection keeps" "$O/indexer_test.log" 2>/dev/null | head -n 4
if command -v cuobjdump >/dev/null; then
  echo "indexer score kernels' SASS: $(cuobjdump --dump-sass $D/fp4moe 2>/dev/null |
    awk '/Function :/{f = ($0 ~ /index_score_kernel/)} f && /MMA/{n++} END{print n+0}') tensor-core (MMA) instructions"
fi
[ "$PARTS" = tests ] && exit $rc
export FP4MOE_COMMIT=${FP4MOE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
timeout 480 $D/fp4moe bench attention --json "$O/bench_attention.json" ${ATTN_BENCH_ARGS:-} 2>&1 | tee "$O/bench_attention.log"
r=${PIPESTATUS[0]}; echo "bench attention: rc=$r"; [ $r -eq 0 ] || rc=1
exit $rc
