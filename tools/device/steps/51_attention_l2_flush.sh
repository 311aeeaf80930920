#!/usr/bin/env bash
# Device step: `fp4moe bench attention`'s decode rows (BF16 cache, dense and sparse) twice in one
# call, L2 emptied before each timed run by a read (clean lines) and by a memset (dirty lines,
# whose write-backs the timed run pays: up to the L2's size). Writes $OUT/attention_l2_{read,write}.{txt,json}.
# Run after tools/device/prebuilt_env.sh (or with build-dev/bin/fp4moe). Env: L2_BATCHES
# (default 1,16,64), L2_CTX (default 8192,32768,131072), L2_MODES (default "read write").
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
F=${FP4MOE_BIN:-build-dev/bin/fp4moe}
for f in ${L2_MODES:-read write}; do
  start=$(date +%s)
  timeout 240 "$F" bench attention --kv bf16 --no-prefill --no-fp8-agreement --no-key-writes \
    --batch "${L2_BATCHES:-1,16,64}" --ctx "${L2_CTX:-8192,32768,131072}" --l2-flush "$f" \
    --json "$OUT/attention_l2_$f.json" > "$OUT/attention_l2_$f.txt" 2>&1
  echo "bench attention --l2-flush $f: rc=$? in $(( $(date +%s) - start )) s"
done
