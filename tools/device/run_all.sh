#!/usr/bin/env bash
# One call on the GPU machine: build everything, run every GPU test (`ctest -L gpu`: every test
# executable that uses a FP4MOE_SKIP_WITHOUT_*() macro, wherever it lives — tests/cuda, tests/tuner,
# tests/cli, tests/engine, tests/moe) and the torch-based tests (`ctest -L torch`: CI has no
# torch, they run only here), then the device steps (tools/device/steps/NN_name.sh: sanitizers and sweeps,
# benchmarks with their baselines, the tuner), writing logs, JSON and plots to $OUT, and a
# short table last. The plan cache of this call is $OUT/plans.json (FP4MOE_PLAN_CACHE): the
# tests run without a tuned plan, `tune` writes it, `bench moe` reads it.
#   bash tools/device/run_all.sh                 build + GPU tests + every step
#   NO_STEPS=1 bash tools/device/run_all.sh      build + GPU tests only
#   bash tools/device/run_all.sh 20_bench_gemm   build + GPU tests + the named steps
#   NO_TESTS=1 bash tools/device/run_all.sh 30_tune 40_bench_moe    (machine still warm)
#   NO_TESTS=1 bash tools/device/run_all.sh 80_serve_sweep        (issue 17: serve sweep + baseline, < 9 min)
#   NO_TESTS=1 bash tools/device/run_all.sh ../extra/host_time_baseline  (optional: forward() host
#                                                  time before / after issue 11, see that script)
#   BUILD_TARGETS="fp4moe gpu_runner_test" GPU_TEST_LABEL=backend-gpu bash tools/device/run_all.sh
#                          a quicker call: those targets only, the GPU tests of one label
#                          (the torch tests run only in a full call, or with TORCH_TESTS=1)
# Exit status: non-zero when the build, a GPU test, a torch test or a step failed, or when a test
# skipped here for another reason than ALLOWED_SKIPS (a regex over gtest's skip message; default:
# the Blackwell-only tests on a Hopper GPU): "no CUDA device" or a missing torch on the GPU
# machine is a broken setup, not a pass. The archive of $OUT is packed either way.
# Device call: carry [".carry"] (tools/device/prepare_carry.sh makes it).
# Without the build (~4 min of device time saved per cold machine): binaries built here, carried.
#   here:   bash tools/device/pack_prebuilt.sh mla_attention_test     (writes .pre/)
#   device: carry [".pre"]; source tools/device/prebuilt_env.sh && bash tools/device/steps/80_serve_sweep.sh
#           (80_serve_sweep and 50_attention use $PRE_BIN; a test: (cd /tmp && $PRE_BIN/mla_attention_test))
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
# When this call started: steps with a time budget (80_serve_sweep) end before the 10-minute limit.
export FP4MOE_CALL_T0=${FP4MOE_CALL_T0:-$(date +%s)}
export FP4MOE_PLAN_CACHE=${FP4MOE_PLAN_CACHE:-$OUT/plans.json}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  echo "commit ${FP4MOE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"; date -u; } | tee "$OUT/env.txt"
failures=()
ALLOWED_SKIPS=${ALLOWED_SKIPS:-needs an sm_120 / sm_100 GPU}
# check_skips LOG: every test that ctest reports as skipped in LOG, re-run verbosely for gtest's
# reason; returns the number of skips whose reason does not match ALLOWED_SKIPS.
check_skips() {
  local bad=0 name why
  for name in $(grep -oE '^\s*[0-9]+ - \S+ \(Skipped\)' "$1" | awk '{print $3}'); do
    why=$(cd build-dev && ctest -R "^$(printf '%s' "$name" | sed 's/[.[\*^$()+?{|]/\\&/g')\$" -V 2>&1 |
          grep -A1 -E ': Skipped$' | tail -n 1 | sed -E 's/^[0-9]+: //')
    [ -n "$why" ] || why="exit code 77 (not installed?)"
    if [[ "$why" =~ $ALLOWED_SKIPS ]]; then
      echo "  skipped (allowed): $name: $why"
    else
      echo "  SKIPPED ON THE GPU MACHINE (a setup failure): $name: $why"
      bad=$((bad + 1))
    fi
  done
  return $bad
}
t0=$(date +%s)
bash tools/device/build.sh ${BUILD_TARGETS:-} > "$OUT/build.log" 2>&1
rc=$?
echo "build: rc=$rc in $(( $(date +%s) - t0 )) s ($(grep -c 'error' "$OUT/build.log") error lines)"
grep -E 'error' "$OUT/build.log" | head -n 5
[ $rc -eq 0 ] || failures+=("build")
if [ -z "${NO_TESTS:-}" ]; then
  t0=$(date +%s)
  (cd build-dev && ctest -L "${GPU_TEST_LABEL:-gpu}" --output-on-failure --timeout 600 --no-tests=error) \
    > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  echo "gpu tests: rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log")"
  [ $rc -eq 0 ] || failures+=("gpu tests")
  # Counts by folder (label), skips (a GPU test that skipped on the GPU is a failure of the setup).
  for l in cuda tuner cli moe engine backend; do
    n=$(cd build-dev && ctest -N -L "^$l-gpu\$" | grep -cE '^\s+Test +#')
    echo "  gpu tests in tests/$l: $n"
  done
  echo "  skipped: $(grep -cE '^\s*[0-9]+ - \S+ \(Skipped\)' "$OUT/gpu_tests.log")"
  check_skips "$OUT/gpu_tests.log" | tee -a "$OUT/gpu_tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failures+=("gpu tests skipped")
  grep -E '^\s+[0-9]+ - .*(Failed|Timeout|Not Run)' "$OUT/gpu_tests.log" | head -n 20
  if [ -z "${BUILD_TARGETS:-}${GPU_TEST_LABEL:-}" ] || [ -n "${TORCH_TESTS:-}" ]; then
    # bench.torch_serve_*: torch is installed here, not in CI; exit 77 (torch missing) is a failure.
    t0=$(date +%s)
    (cd build-dev && ctest -L torch --output-on-failure --no-tests=error) > "$OUT/torch_tests.log" 2>&1
    rc=$?
    echo "torch tests: rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$OUT/torch_tests.log")"
    [ $rc -eq 0 ] || failures+=("torch tests")
    ALLOWED_SKIPS='^$' check_skips "$OUT/torch_tests.log" | tee -a "$OUT/torch_tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failures+=("torch tests skipped")
  fi
fi
steps=("$@")
if [ ${#steps[@]} -eq 0 ] && [ -z "${NO_STEPS:-}" ]; then
  for s in tools/device/steps/*.sh; do steps+=("$(basename "$s" .sh)"); done
fi
for name in "${steps[@]}"; do
  t0=$(date +%s)
  bash "tools/device/steps/$name.sh" > "$OUT/$(basename "$name").log" 2>&1
  rc=$?
  echo "step $name: rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || failures+=("step $name")
done
echo "---- summary ----"
for name in "${steps[@]}"; do grep -hE '^\||host us' "$OUT/$(basename "$name").log" 2>/dev/null | head -n 40; done
if [ ${#failures[@]} -gt 0 ]; then
  echo "FAILED: ${failures[*]}" | tee "$OUT/FAILED.txt"
else
  echo "all passed (build, GPU tests, steps)"
fi
# The device tool returns at most 8 files: pack everything into one archive.
tar czf /tmp/fp4moe_results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/fp4moe_results.tgz "$OUT/results_${RESULTS_TAG:-run}.tgz"
[ ${#failures[@]} -eq 0 ]
