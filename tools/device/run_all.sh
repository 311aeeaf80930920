#!/usr/bin/env bash
# One call on the GPU machine: build everything, run every GPU test, run each step in
# tools/device/steps/*.sh (benchmarks with their baselines), write logs/JSON/plots to $OUT,
# print a short table last.
#   device run: bash tools/device/run_all.sh      (carry: [".carry"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; git log -1 --format='commit %H' 2>/dev/null; } | tee "$OUT/env.txt"
t0=$(date +%s)
bash tools/device/build.sh 2>&1 | tail -n 30 > "$OUT/build.log" || { cat "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
(cd build-dev && ctest -L cuda --output-on-failure --timeout 300) > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: rc=$? ($(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log"))"
for step in tools/device/steps/*.sh; do
  [ -e "$step" ] || continue
  name=$(basename "$step" .sh)
  bash "$step" > "$OUT/$name.log" 2>&1
  echo "step $name: rc=$?"
done
echo "---- summary ----"
grep -hE '^\|' "$OUT"/*.log 2>/dev/null | tail -n 60
