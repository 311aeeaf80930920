#!/usr/bin/env bash
# Issue 39 on the GPU with carried binaries ($PRE_BIN, tools/device/prebuilt_env.sh): a 5-layer
# GLM-5-dims checkpoint with one MTP layer (make-synthetic, ~2-3 min), then
#   1. generate --backend cuda greedy, plain vs --speculative-algorithm NEXTN (N 1 and 3): the
#      tokens must be identical (lossless), and the accept counts are printed;
#   2. bench step --speculative-algorithm NEXTN --speculative-num-steps 3 at B 1/8/64, ctx 1024:
#      verify / draft / round ms beside the plain decode step.
# Synthetic weights: the MTP layer's acceptance is near chance, so tok/s at acceptance a (the
# bench's table) is the number to read, not the measured acceptance.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/spec; mkdir -p "$O"
BD=${PRE_BIN:-build-dev/bin}
M=${SPEC_MODEL_DIR:-/tmp/glm5-mtp}
if [ ! -f "$M/config.json" ]; then
  t0=$(date +%s)
  timeout 400 "$BD/fp4moe" make-synthetic "$M" --preset glm5-layer --layers 5 --dense-layers 3 --mtp-layers 1 \
    > "$O/make_synthetic.log" 2>&1
  echo "make-synthetic (5 layers + 1 MTP): rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 "$O/make_synthetic.log"
fi
P=$(python3 -c "print(','.join(str(7+i*37%150000) for i in range(200)))")
rc=0
for s in 0 1 3; do
  extra=(); [ $s -gt 0 ] && extra=(--speculative-algorithm NEXTN --speculative-num-steps $s)
  t0=$(date +%s)
  timeout 150 "$BD/fp4moe" generate --model "$M" --backend cuda --prompt-ids "$P" --max-new-tokens 64 \
    "${extra[@]}" > "$O/gen_s$s.out" 2> "$O/gen_s$s.err"
  r=$?; echo "generate spec steps $s: rc=$r in $(( $(date +%s) - t0 )) s"; [ $r -eq 0 ] || rc=1
  grep -iE 'accept|speculat|error|fp4moe:' "$O/gen_s$s.err" | cut -c1-400 | head -5
done
for s in 1 3; do
  if [ -s "$O/gen_s0.out" ] && cmp -s "$O/gen_s0.out" "$O/gen_s$s.out"; then echo "NEXTN $s steps: tokens identical to plain greedy (lossless)"
  else echo "NEXTN $s steps: TOKENS DIFFER from plain greedy"; diff "$O/gen_s0.out" "$O/gen_s$s.out" | head -6; rc=1; fi
done
t0=$(date +%s)
timeout ${SPEC_BENCH_S:-240} "$BD/fp4moe" bench step --model "$M" --batch 1,8,64 --ctx 1024 --prefill 1024 --k 1 --iters 10 \
  --speculative-algorithm NEXTN --speculative-num-steps 3 --json "$O/bench_spec.json" > "$O/bench_spec.log" 2> "$O/bench_spec.err"
echo "bench step NEXTN 3: rc=$? in $(( $(date +%s) - t0 )) s"; grep -E 'memory plan|error|fp4moe:' "$O/bench_spec.err" | cut -c1-400
cat "$O/bench_spec.log"
exit $rc
