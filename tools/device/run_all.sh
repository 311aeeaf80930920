#!/usr/bin/env bash
# One call on the GPU machine: build everything, run every GPU test (`ctest -L gpu`: every test
# executable that calls FP4MOE_SKIP_WITHOUT_GPU(), wherever it lives — tests/cuda, tests/tuner,
# tests/cli), then the device steps (tools/device/steps/NN_name.sh: sanitizers and sweeps,
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
#   BUILD_TARGETS="fp4moe gpu_runner_test" GPU_TEST_LABEL=engine-gpu bash tools/device/run_all.sh
#                          a quicker call: those targets only, the GPU tests of one label
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
t0=$(date +%s)
bash tools/device/build.sh ${BUILD_TARGETS:-} > "$OUT/build.log" 2>&1
echo "build: rc=$? in $(( $(date +%s) - t0 )) s ($(grep -c 'error' "$OUT/build.log") error lines)"
grep -E 'error' "$OUT/build.log" | head -n 5
if [ -z "${NO_TESTS:-}" ]; then
  t0=$(date +%s)
  (cd build-dev && ctest -L "${GPU_TEST_LABEL:-gpu}" --output-on-failure --timeout 300) > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log")"
  # Counts by folder (label), skips (a GPU test that skipped on the GPU is a failure of the setup).
  for l in cuda tuner cli moe engine; do
    n=$(cd build-dev && ctest -N -L "^$l-gpu\$" | grep -cE '^\s+Test +#')
    echo "  gpu tests in tests/$l: $n"
  done
  echo "  skipped: $(grep -cE '\[  SKIPPED \]|Skipped' "$OUT/gpu_tests.log")"
  grep -E '^\s+[0-9]+ - .*(Failed|Timeout|Not Run)' "$OUT/gpu_tests.log" | head -n 20
fi
steps=("$@")
if [ ${#steps[@]} -eq 0 ] && [ -z "${NO_STEPS:-}" ]; then
  for s in tools/device/steps/*.sh; do steps+=("$(basename "$s" .sh)"); done
fi
for name in "${steps[@]}"; do
  t0=$(date +%s)
  bash "tools/device/steps/$name.sh" > "$OUT/$(basename "$name").log" 2>&1
  echo "step $name: rc=$? in $(( $(date +%s) - t0 )) s"
done
echo "---- summary ----"
for name in "${steps[@]}"; do grep -hE '^\||host us' "$OUT/$(basename "$name").log" 2>/dev/null | head -n 40; done
# The device tool returns at most 8 files: pack everything into one archive.
tar czf /tmp/fp4moe_results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/fp4moe_results.tgz "$OUT/results_${RESULTS_TAG:-run}.tgz"
