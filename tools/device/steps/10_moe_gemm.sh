#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built and the GPU tests ran): compute-sanitizer
# passes on a small case, a SASS check (HGMMA present), the GLM-5 timing sweep of every config
# and the decode split-K sweep (table rows start with '|'). Logs under $OUT. The correctness
# tests themselves run in run_all.sh's `ctest -L gpu`.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${MOE_GEMM_TEST:-build-dev/bin/moe_gemm_test}
[ -x "$B" ] || cmake --build build-dev -j "$(nproc)" --target moe_gemm_test >/dev/null
timeout 60 "$B" --gtest_filter='*TinyPreset*:*Errors*:*Layout*' > "$OUT/moe_gemm_quick.log" 2>&1
rc=$?; echo "quick tests rc=$rc"; [ $rc -eq 124 ] && { echo "HANG in quick tests"; exit 1; }
timeout 120 compute-sanitizer --tool memcheck "$B" --gtest_filter='*TinyPreset*' > "$OUT/moe_gemm_memcheck.log" 2>&1
echo "memcheck: $(grep -E 'ERROR SUMMARY' "$OUT/moe_gemm_memcheck.log")"
timeout 120 compute-sanitizer --tool racecheck "$B" --gtest_filter='*TinyPreset*' > "$OUT/moe_gemm_racecheck.log" 2>&1
echo "racecheck: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/moe_gemm_racecheck.log")"
if command -v cuobjdump >/dev/null; then echo "HGMMA in SASS: $(cuobjdump --dump-sass "$B" | grep -c HGMMA)"; fi
timeout 180 "$B" --gtest_also_run_disabled_tests --gtest_filter="*Glm5Sweep*" > "$OUT/moe_gemm_perf.log" 2>&1
echo "perf rc=$?"; grep '^|' "$OUT/moe_gemm_perf.log"
timeout 120 "$B" --gtest_also_run_disabled_tests --gtest_filter='*DecodeSplitSweep*' > "$OUT/moe_gemm_split.log" 2>&1
echo "split sweep rc=$?"; grep '^| split' "$OUT/moe_gemm_split.log"
