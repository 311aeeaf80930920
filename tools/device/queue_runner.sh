#!/usr/bin/env bash
# One device call for the runner with carried binaries (tools/device/prebuilt_env.sh first; pack
# with: bash tools/device/pack_prebuilt.sh gpu_runner_test gpu_decode_test gpu_sampling_test
# gpu_attention_test indexer_test): the runner's GPU tests (60_runner.sh's part 1: one case each
# under compute-sanitizer memcheck, then the whole test), then `bench attention` at B 256 (32K,
# 128K; BF16, write flush) for the many-row top-k and pipeline rows, and at B 1-8 (32K) for the
# sparse MLA kernels' crossover. ~5-8 min.
#   QUEUE_PARTS="tests bench" picks parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
D=${PRE_BIN:-build-dev/bin}
PARTS=${QUEUE_PARTS:-tests bench}
run_test() {  # NAME MEMCHECK_FILTER|- TIMEOUT_S
  local name=$1 filter=$2 limit=$3 B=$D/$1 r t0
  [ -x "$B" ] || { echo "$name: not carried / built"; return; }
  if [ "$filter" != - ]; then
    (cd /tmp && timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$B" --gtest_filter="$filter") > "$OUT/${name}_memcheck.log" 2>&1
    r=$?; echo "$name memcheck ($filter): rc=$r $(grep -E 'ERROR SUMMARY' "$OUT/${name}_memcheck.log" | tail -n 1)"
  fi
  t0=$(date +%s)
  (cd /tmp && timeout "$limit" "$B") > "$OUT/$name.log" 2>&1
  r=$?; echo "$name: rc=$r in $(( $(date +%s) - t0 )) s $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure' "$OUT/$name.log" | head -n 10
}
if [[ " $PARTS " == *" tests "* ]]; then
  run_test gpu_runner_test 'Tiny/GpuVsCpu.*glm5_tiny_sparse_nvfp4_all*' 300
  run_test gpu_decode_test - 200
  run_test gpu_sampling_test 'GpuSampling.KStepsPerLaunchEqualKLaunchesOfOneBitForBit' 200
  run_test gpu_attention_test 'RealAttentionDims/FastAttention.GraphReplayEqualsEagerBitForBit/glm5_attn_tiny' 200
fi
if [[ " $PARTS " == *" bench "* ]]; then
  t0=$(date +%s)
  timeout 240 "${FP4MOE_BIN:-$D/fp4moe}" bench attention --kv bf16 --no-prefill --no-fp8-agreement --no-key-writes \
    --batch 256 --ctx 32768,131072 --json "$OUT/attention_b256.json" > "$OUT/attention_b256.txt" 2>&1
  echo "bench attention B 256: rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "topk|sparse-decode" "$OUT/attention_b256.txt" | cut -c1-170
  # The small-batch crossover of the sparse MLA kernels (the runner's kMmaSparseMaxRows).
  t0=$(date +%s)
  timeout 120 "${FP4MOE_BIN:-$D/fp4moe}" bench attention --kv bf16 --no-prefill --no-fp8-agreement --no-key-writes \
    --batch 1,2,4,8 --ctx 32768 --json "$OUT/attention_small_b.json" > "$OUT/attention_small_b.txt" 2>&1
  echo "bench attention B 1-8: rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "sparse-mla|sparse-decode" "$OUT/attention_small_b.txt" | grep -E "dev|floor" | cut -c1-170
fi
