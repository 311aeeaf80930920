#!/usr/bin/env bash
# One device call for the runner with carried binaries (tools/device/prebuilt_env.sh first; pack
# with: bash tools/device/pack_prebuilt.sh gpu_runner_test gpu_decode_test gpu_sampling_test
# gpu_attention_test indexer_test): the runner's GPU tests (RUNNER_TESTS_ONLY=1 60_runner.sh: one
# case each under compute-sanitizer memcheck, then the whole test; logs in $OUT/runner), then
# `bench attention` at B 256 (32K, 128K; BF16, write flush) for the many-row top-k and pipeline
# rows, and at B 1-8 (32K) for the sparse MLA kernels' crossover. ~5-8 min.
#   QUEUE_PARTS="tests bench" picks parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
D=${PRE_BIN:-build-dev/bin}
PARTS=${QUEUE_PARTS:-tests bench}
if [[ " $PARTS " == *" tests "* ]]; then
  RUNNER_TESTS_ONLY=1 bash tools/device/steps/60_runner.sh
  echo "60_runner (tests): rc=$?"
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
