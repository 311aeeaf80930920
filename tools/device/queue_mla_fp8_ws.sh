#!/usr/bin/env bash
# One device call for issue 40 item 3: MlaDecodeMma's warp-specialized FP8 decode kernel
# (DecodeMath::kWgmmaWs, cuda/attention/mla_decode_ws.cuh), compiled and emulator-tested on the
# dev machine, not yet run on a GPU. In the order that stops early on a broken kernel:
#   1. mla_attention_test's warp-specialized cases (dense every page size, 1 .. 100K keys, 128
#      heads, top-2048 rows, device schedule in a graph), then its Tiny case under
#      compute-sanitizer memcheck and racecheck (named barriers, the two rings);
#   2. `bench attention`, FP8 cache, dense decode only, the FP8 table's points B 1/16/64/256 x ctx
#      1K/8K/32K/128K (read flush): ours-wgmma-ws(-dev) and ours-wgmma-ws-qreg(-dev) (Q mostly in
#      registers) beside ours-mma, ours-wgmma, flashinfer-sm90 and the floor kernels.
# ~2-4 min in all (the test cases ~30 s, sanitizers ~60 s, the bench ~1-2 min).
# Binaries: build-dev/bin (bash tools/device/build.sh mla_attention_test fp4moe) or $PRE_BIN.
# QUEUE_PARTS="tests bench" picks parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
D=${PRE_BIN:-build-dev/bin}
PARTS=${QUEUE_PARTS:-tests bench}
t_all=$(date +%s)
rc=0
if [[ " $PARTS " == *" tests "* ]]; then
  T=$D/mla_attention_test
  t0=$(date +%s)
  (cd /tmp && timeout 120 "$T" --gtest_filter='*WgmmaWs*:MlaDecodeMmaTiny.*') > "$OUT/mla_ws_test.log" 2>&1
  r=$?; echo "mla_attention_test (*WgmmaWs*, MlaDecodeMmaTiny.*): rc=$r in $(( $(date +%s) - t0 )) s" \
    "$(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$OUT/mla_ws_test.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|worst' "$OUT/mla_ws_test.log" | head -n 20
  [ $r -eq 0 ] || rc=1
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$T" \
      --gtest_filter='MlaDecodeMmaTiny.WgmmaWs*' > "$OUT/mla_ws_$tool.log" 2>&1
    r=$?; echo "mla decode (wgmma-ws) $tool (tiny): rc=$r in $(( $(date +%s) - t0 )) s" \
      "$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/mla_ws_$tool.log" | tail -n 1)"
    [ $r -eq 0 ] || rc=1
  done
fi
if [[ " $PARTS " == *" bench "* ]]; then
  export FP4MOE_COMMIT=${FP4MOE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
  t0=$(date +%s)
  timeout 200 "${FP4MOE_BIN:-$D/fp4moe}" bench attention --kv fp8 --batch 1,16,64,256 --ctx 1024,8192,32768,131072 \
    --no-sparse --no-prefill --no-fp8-agreement --no-key-writes --l2-flush read \
    --json "$OUT/attention_fp8_ws.json" > "$OUT/attention_fp8_ws.txt" 2>&1
  r=$?; echo "bench attention fp8 (decode): rc=$r in $(( $(date +%s) - t0 )) s"
  [ $r -eq 0 ] || rc=1
  grep -E '^\| (flashinfer-sm90|floor-move|ours-mma|ours-wgmma|ours-wgmma-ws|ours-wgmma-ws-dev|ours-wgmma-ws-qreg|ours-wgmma-ws-qreg-dev) \|' \
    "$OUT/attention_fp8_ws.txt" | head -n 160
fi
echo "queue_mla_fp8_ws: rc=$rc in $(( $(date +%s) - t_all )) s"
exit $rc
