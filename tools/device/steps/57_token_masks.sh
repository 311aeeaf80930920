#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): grammar masks on the GPU (issue 42 item 2).
#   1. backend_ops_test's token_bitmask rows (cuda/sampling/token_bitmask_f32 vs
#      cpu::apply_token_bitmask, then the argmax of the masked rows; GLM-5's 154,880 vocab too);
#   2. gpu_token_mask_test: the runner's masked greedy and sampled steps = the host (masked logits
#      bit for bit, argmax, cpu::sample_cpu per row), graph replay with masks = eager bit for
#      bit, slots reset after a masked step; the graph case first under compute-sanitizer memcheck;
#   3. structured_output_e2e_test.py --backend cuda: `serve --backend cuda` on a toy GLM-5 with a
#      real tokenizer: regex / json_schema / ebnf requests finish and validate in every sampling
#      mode, a mixed batch of constrained + unconstrained requests = each alone;
#   4. `fp4moe bench step --token-masks` on the GLM-5-dims model of 60_runner.sh (RUNNER_MODEL_DIR,
#      made here when missing; 13 layers replicated): the decode step with a mask on every request
#      vs without, B 1 / 64 / 256 at ctx 1024 (issue 42's target: ratio <= 1.05 at B 64).
# Expected: ~1 min tests, ~1 min e2e, bench ~2-4 min (+ make-synthetic when the model is missing).
# Look for: "gpu_token_mask_test: rc=0" (2 passed, none skipped), "ERROR SUMMARY: 0 errors", the
# e2e's "OK", the bench's "grammar masks on every request" table (ratio and device ratio columns).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/token_masks"
O=$OUT/token_masks
BD=${PRE_BIN:-build-dev/bin}
for t in backend_ops_test gpu_token_mask_test sampling_cpu_test fp4moe; do
  [ -x "$BD/$t" ] || [ -n "${PRE_BIN:-}" ] || bash tools/device/build.sh $t > "$O/build_$t.log" 2>&1
done
rc=0
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $BD/gpu_token_mask_test \
  --gtest_filter='GpuTokenMasks.GraphReplayWithMasksEqualsEagerBitForBit' > "$O/gpu_token_mask_memcheck.log" 2>&1
r=$?; echo "gpu_token_mask_test memcheck: rc=$r $(grep -E 'ERROR SUMMARY' "$O/gpu_token_mask_memcheck.log" | tail -n 1)"
[ $r -eq 0 ] || rc=1
for spec in "backend_ops_test --gtest_filter=*token_bitmask*:*argmax*" "gpu_token_mask_test" "sampling_cpu_test"; do
  set -- $spec
  t=$1; shift
  [ -x "$BD/$t" ] || { echo "$t: not built"; rc=1; continue; }
  timeout 300 "$BD/$t" "$@" --gtest_output=xml:"$O/$t.xml" > "$O/$t.log" 2>&1
  r=$?; echo "$t: rc=$r $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$O/$t.log" | tr '\n' ' ')"; [ $r -eq 0 ] || rc=1
  grep -E '^\[  FAILED  \]|Failure|Expected|Which is|device [0-9-]+, host|not allowed' "$O/$t.log" | head -n 30
done
grep -oE 'near_tie_rows="[^"]*"' "$O/gpu_token_mask_test.xml" 2>/dev/null | tr '\n' ' '; echo
if ! python3 -c 'import openai' 2>/dev/null && [ -d .carry/wheels ]; then
  python3 -m pip install -q --no-index --find-links .carry/wheels --target .carry/pylib openai==2.8.1 \
    > "$O/pip_openai.log" 2>&1 || tail -n 5 "$O/pip_openai.log"
  export PYTHONPATH=$PWD/.carry/pylib${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 300 python3 tests/serve/structured_output_e2e_test.py $BD/fp4moe --backend cuda > "$O/e2e.log" 2>&1
r=$?; echo "structured_output_e2e --backend cuda: rc=$r (77 = openai missing): $(tail -n 1 "$O/e2e.log")"
[ $r -eq 0 ] || { rc=1; grep -E 'FAIL|Error|assert' "$O/e2e.log" | head -n 20; }
[ -n "${MASKS_TESTS_ONLY:-}" ] && exit $rc  # MASKS_TESTS_ONLY=1: 1-3 only
M=${RUNNER_MODEL_DIR:-/tmp/glm5-runner}
if [ ! -f "$M/config.json" ]; then
  t0=$(date +%s)
  timeout 900 $BD/fp4moe make-synthetic "$M" --preset glm5-layer --layers "${RUNNER_LAYERS:-5}" \
    --dense-layers "${RUNNER_DENSE:-3}" > "$O/make_synthetic.log" 2>&1
  echo "make-synthetic glm5-layer: rc=$? in $(( $(date +%s) - t0 )) s"
fi
t0=$(date +%s)
timeout 500 $BD/fp4moe bench step --model "$M" --token-masks --json "$O/bench_step_masks.json" \
  ${MASKS_BENCH_ARGS:---batch 1,64,256 --ctx 1024 --prefill 1024 --k 1 --replicate-layers ${RUNNER_REPLICATE:-13}} \
  > "$O/bench_step_masks.log" 2> "$O/bench_step_masks.err"
r=$?; echo "bench step --token-masks: rc=$r in $(( $(date +%s) - t0 )) s"; [ $r -eq 0 ] || rc=1
grep -E '^\||ceilings|grammar masks' "$O/bench_step_masks.log"; grep -E 'memory plan|cuda graphs|error' "$O/bench_step_masks.err" | head -n 4
exit $rc
