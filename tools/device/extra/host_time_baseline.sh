#!/usr/bin/env bash
# Optional device step (not in run_all.sh's default list; run it by name, see below): the host
# time of one MoE-layer forward() at T=1, before and after issue 11's "no per-call host work",
# measured the same way (median of 200 enqueue-only calls, the stream drained every 8 calls
# outside the timed window) on the same GPU in the same call:
#   before: commit c88aec0 (tile config looked up through the tuner's mutex and registry, and
#           FP4MOE_SM90_SPLITS read, on every GEMM launch), built from .carry/baseline_c88aec0.tar.gz
#           with tools/device/extra/host_time_baseline.patch (adds the measurement to its bench moe);
#   after:  this tree's `fp4moe bench moe` ("host us" column).
# Needs build-dev/ (run_all.sh builds it) and the baseline tarball (tools/device/prepare_carry.sh).
#   NO_TESTS=1 bash tools/device/run_all.sh ../extra/host_time_baseline
# Takes ~5 min (a second build of the sm_90a kernels, two GLM-5-size random layers).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
ROOT=$PWD
SRC=$ROOT/.carry/baseline_c88aec0.tar.gz
[ -f "$SRC" ] || { echo "no $SRC: run tools/device/prepare_carry.sh with git available"; exit 1; }
export PATH=/usr/local/cuda/bin:$PATH
D=/tmp/fp4moe_baseline_c88aec0
rm -rf "$D" && mkdir -p "$D" && tar xzf "$SRC" -C "$D" || exit 1
(cd "$D" && patch -p1 < "$ROOT/tools/device/extra/host_time_baseline.patch") || exit 1
t0=$(date +%s)
cmake -S "$D" -B "$D/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFP4MOE_TESTS=OFF \
  -DFP4MOE_DEPS_PREFIX="$ROOT/.carry" > "$OUT/baseline_build.log" 2>&1 &&
  cmake --build "$D/build" -j "$(nproc)" --target fp4moe >> "$OUT/baseline_build.log" 2>&1
echo "baseline build: rc=$? in $(( $(date +%s) - t0 )) s"
export FP4MOE_PLAN_CACHE=/tmp/fp4moe_host_time_plans.json  # the same (empty) plan for both
rm -f "$FP4MOE_PLAN_CACHE"
timeout 240 "$D/build/bin/fp4moe" bench moe --tokens 1 --iters 10 --graph-max-tokens 0 > "$OUT/host_time_before.log" 2>&1
echo "before (c88aec0): $(grep -h 'baseline host us' "$OUT/host_time_before.log")"
timeout 240 build-dev/bin/fp4moe bench moe --tokens 1 --iters 10 --graph-max-tokens 0 > "$OUT/host_time_after.log" 2>&1
echo "after (this tree): host us per forward at T=1 = $(grep -E '^\| 1 \|' "$OUT/host_time_after.log" | awk -F'|' '{gsub(/ /, "", $7); print $7}')"
grep -E '^\|' "$OUT/host_time_after.log"
