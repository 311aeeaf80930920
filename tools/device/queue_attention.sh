#!/usr/bin/env bash
# One device call for what sessions 13-14 queued on issue 13 (all compiled and emulator-tested
# here, none run on a GPU yet), in the order that stops early on a broken kernel:
#   1. the attention / indexer GPU tests, memcheck and racecheck on the *Tiny* cases
#      (50_attention.sh, tests part): the slot ring, the merge, PDL, the 32K one-CTA top-k, the
#      wgmma decode variant (BF16 and FP8);
#   2. device_common_test (the floor kernels) and gpu_attention_test (the runner per layer,
#      +fi and +wg);
#   3. bench attention's decode rows under both L2 flushes (51_attention_l2_flush.sh; BF16), then
#      the FP8 cache once (read flush), then a per-row comparison of the two flushes.
# Binaries: carried prebuilt ones (source tools/device/prebuilt_env.sh first; see pack_prebuilt.sh:
#   bash tools/device/pack_prebuilt.sh indexer_test mla_attention_test device_common_test \
#        gpu_attention_test kv_append_test kv_latent_prep_test index_key_prep_test mla_prefill_expanded_test
# ) or build-dev/bin. ~6-8 min in all; QUEUE_PARTS="tests bench" picks parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
D=${PRE_BIN:-build-dev/bin}
PARTS=${QUEUE_PARTS:-tests bench}
t_all=$(date +%s)
if [[ " $PARTS " == *" tests "* ]]; then
  t0=$(date +%s)
  ATTN_PARTS=tests timeout 330 bash tools/device/steps/50_attention.sh
  echo "50_attention (tests): rc=$? in $(( $(date +%s) - t0 )) s"
  for t in device_common_test gpu_attention_test; do
    [ -x "$D/$t" ] || { echo "$t: not carried / built"; continue; }
    t0=$(date +%s)
    (cd /tmp && timeout 200 "$D/$t") > "$OUT/$t.log" 2>&1
    echo "$t: rc=$? in $(( $(date +%s) - t0 )) s $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -n 10
  done
fi
if [[ " $PARTS " == *" bench "* ]]; then
  FP4MOE_BIN=${FP4MOE_BIN:-$D/fp4moe} timeout 420 bash tools/device/steps/51_attention_l2_flush.sh
  F=${FP4MOE_BIN:-$D/fp4moe}
  t0=$(date +%s)
  timeout 200 "$F" bench attention --kv fp8 --no-prefill --no-fp8-agreement --no-key-writes --batch 1,16,64 \
    --ctx 8192,32768 --l2-flush read --json "$OUT/attention_fp8_read.json" > "$OUT/attention_fp8_read.txt" 2>&1
  echo "bench attention fp8: rc=$? in $(( $(date +%s) - t0 )) s"
  [ -f "$OUT/attention_l2_read.json" ] && [ -f "$OUT/attention_l2_write.json" ] &&
    python3 tools/device/compare_attention_runs.py "$OUT/attention_l2_read.json" "$OUT/attention_l2_write.json" \
      > "$OUT/attention_l2_compare.txt" 2>&1 && head -n 60 "$OUT/attention_l2_compare.txt"
fi
echo "queue_attention: $(( $(date +%s) - t_all )) s"
