#!/usr/bin/env bash
# One device call with carried binaries ($PRE_BIN, tools/device/prebuilt_env.sh), the first of a
# session: the GPU tests of kernels merged since they last ran on a GPU, the speculative round's
# costs on the trained mini model, and the host round on the GPU machine's cores — while
# make-synthetic writes the 5-layer GLM-5-dims checkpoint (/tmp/glm5-runner) for the next call in
# the background (CPU work on that machine; waited for before the call ends).
#   RECHECK_TESTS="a_test b_test" picks the test binaries (default: every *_test carried).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
BD=${PRE_BIN:?source tools/device/prebuilt_env.sh first}
M=${RECHECK_MODEL_DIR:-/tmp/glm5-runner}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit $(cat .pre/COMMIT 2>/dev/null)"
mk=0
if [ ! -f "$M/config.json" ]; then
  (t0=$(date +%s); nice timeout 400 "$BD/fp4moe" make-synthetic "$M" --preset glm5-layer --layers 5 --dense-layers 3 \
    > "$OUT/make_synthetic.log" 2>&1; echo "make-synthetic 5 layers: rc=$? in $(( $(date +%s) - t0 )) s" >> "$OUT/make_synthetic.log") &
  mk=$!
fi
rc=0
tests=${RECHECK_TESTS:-$(cd "$BD" && ls *_test 2>/dev/null | tr '\n' ' ')}
cd /tmp
for b in $tests; do
  t0=$(date +%s)
  timeout 300 "$BD/$b" > "$OUT/$b.log" 2>&1
  r=$?
  echo "$b rc=$r in $(( $(date +%s) - t0 )) s $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$OUT/$b.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/$b.log" | head -n 10
  [ $r -eq 0 ] || rc=1
done
# The host round's CPU cost on this machine's cores (16 threads at most): fake steps, vocab 154,880.
if [ -x "$BD/spec_host_round_test" ]; then
  timeout 200 "$BD/spec_host_round_test" --gtest_also_run_disabled_tests --gtest_filter='*TimeRounds*' \
    > "$OUT/host_round_timing.log" 2>&1
  echo "host round timing: rc=$?"; grep -vE '^\[|^$|^Note' "$OUT/host_round_timing.log" | head -n 40
fi
# The speculative round's costs on the trained mini model (launch-bound: what a round costs in
# plain steps), every step a graph.
timeout 200 "$BD/fp4moe" bench step --model "$REPO/models/glm5-mini-py" --batch 1,16,64 --ctx 1024 --prefill 1024 \
  --k 1,8 --iters 20 --speculative-algorithm NEXTN --speculative-num-steps 3 --json "$OUT/mini_spec_step.json" \
  > "$OUT/mini_spec_step.log" 2> "$OUT/mini_spec_step.err"
echo "bench step (mini, NEXTN 3): rc=$?"; grep -E '^\||speculative|round' "$OUT/mini_spec_step.log" | head -n 60
grep -E 'error|fp4moe:' "$OUT/mini_spec_step.err" | head -n 5
if [ $mk -ne 0 ]; then wait $mk; tail -n 2 "$OUT/make_synthetic.log"; fi
exit $rc
