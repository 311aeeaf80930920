#!/usr/bin/env bash
# One device call with carried binaries ($PRE_BIN, tools/device/prebuilt_env.sh) for issues 43 and
# 40: every row of issue 43's table on this GPU beside its floor and the ceilings measured in the
# same run, and the FP8 cache's decode kernel choice (FlashInfer's FP8 SM90 MLA against
# MlaDecodeMma) at the step level. Needs the 5-layer GLM-5-dims checkpoint (/tmp/glm5-runner:
# queue_recheck.sh writes it; made here otherwise, ~2 min).
#   REPORT_PARTS="fp8 step moe gemm ncu" picks parts (default: all, in that order); REPORT_BF16=0
#   skips the fp8 part's BF16 baseline (its numbers are in RESULTS, sixth session).
# Look for: each bench step table's "x floor" and "per-stage" rows; the FP8 runs' decode ms at
# B 64 / 8K and prefill ms with each kernel (auto = mma-decode since kFp8DecodeOnMma); bench moe's
# T = 1 row (x byte floor) and bench gemm's gate_up T = 8192 TFLOP/s; the ncu prefill table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; O=$OUT/report; mkdir -p "$O"
BD=${PRE_BIN:?source tools/device/prebuilt_env.sh first}
M=${REPORT_MODEL_DIR:-/tmp/glm5-runner}
PARTS=${REPORT_PARTS:-fp8 step moe gemm ncu}
export FP4MOE_COMMIT=${FP4MOE_COMMIT:-$(cat .pre/COMMIT 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "commit $FP4MOE_COMMIT"
t_all=$(date +%s)
if [ ! -f "$M/config.json" ]; then
  t0=$(date +%s)
  timeout 400 "$BD/fp4moe" make-synthetic "$M" --preset glm5-layer --layers 5 --dense-layers 3 > "$O/make_synthetic.log" 2>&1
  echo "make-synthetic 5 layers: rc=$? in $(( $(date +%s) - t0 )) s"
fi
rc=0
on() { [[ " $PARTS " == *" $1 "* ]]; }
# bench NAME TIMEOUT ARGS...: one bench step run over the 13-layer replication.
bench() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$limit" "$BD/fp4moe" bench step --model "$M" --replicate-layers 13 --json "$O/$name.json" "$@" \
    > "$O/$name.log" 2> "$O/$name.err"
  local r=$?
  echo "== $name: bench step $*: rc=$r in $(( $(date +%s) - t0 )) s"
  grep -E 'attention:|error|fp4moe:' "$O/$name.err" | cut -c1-400 | head -n 4
  grep -E '^\||ceilings|per-stage' "$O/$name.log"
  [ $r -eq 0 ] || rc=1
}
if on fp8; then
  # BF16 baseline at the point both fit (B 64 x 6K), then FP8 with each decode kernel at 6K and 8K.
  [ "${REPORT_BF16:-1}" = 1 ] && bench bf16 150 --batch 64 --ctx 6144 --prefill 1024,4096 --k 1 --iters 10
  bench fp8_flashinfer 150 --batch 1,64 --ctx 6144,8192 --prefill 1024,4096 --k 1 --iters 10 \
    --kv-cache-dtype fp8_e4m3 --attention-kernels flashinfer-decode
  bench fp8_auto 150 --batch 1,64 --ctx 6144,8192 --prefill 1024,4096 --k 1 --iters 10 --kv-cache-dtype fp8_e4m3
  # Issue 40's 128K rows (B 1 and B 8; the plan skips B 8 where its KV does not fit beside 13 layers).
  bench fp8_128k 120 --batch 1,8 --ctx 131072 --prefill 1024 --k 1 --iters 10 --kv-cache-dtype fp8_e4m3
fi
if on step; then
  # Issue 43's decode rows (ctx 1K) and prefill 4K; B 1024 is skipped by the plan where it does not fit.
  bench step13 200 --batch 1,8,64,256,1024 --ctx 1024 --prefill 4096 --k 1,8 --iters 10
fi
if on moe; then
  t0=$(date +%s)
  timeout 150 "$BD/fp4moe" bench moe --tokens 1,8,64,256 --iters 50 --json "$O/moe.json" > "$O/moe.log" 2>&1
  echo "== bench moe: rc=$? in $(( $(date +%s) - t0 )) s"; grep -E '^\||ceiling|copy|floor' "$O/moe.log" | head -n 30
fi
if on gemm; then
  t0=$(date +%s)
  timeout 150 "$BD/fp4moe" bench gemm --op both --tokens 8192,16384 --configs best --iters 20 --json "$O/gemm.json" \
    > "$O/gemm.log" 2>&1
  echo "== bench gemm: rc=$? in $(( $(date +%s) - t0 )) s"; grep -E '^\||ceiling|peak|TFLOP' "$O/gemm.log" | head -n 30
fi
if on ncu && command -v ncu >/dev/null; then
  # One 4096-token prefill of the 5-layer checkpoint (no replication), every kernel timed once
  # (ncu's own clocks off, no cache flush between kernels: the step as it runs), aggregated per
  # kernel name by tools/device/ncu_by_kernel.py.
  P=$(python3 -c "print(','.join(str(7+i*37%150000) for i in range(4096)))")
  t0=$(date +%s)
  timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$O/ncu_prefill4k.csv" "$BD/fp4moe" generate --model "$M" --backend cuda --prompt-ids "$P" \
    --max-new-tokens 1 > "$O/ncu_prefill4k.out" 2> "$O/ncu_prefill4k.err"
  echo "== ncu prefill 4096 (5 layers): rc=$? in $(( $(date +%s) - t0 )) s"
  python3 tools/device/ncu_by_kernel.py "$O/ncu_prefill4k.csv" --after-name 'embed' --top 25 || rc=1
fi
echo "queue_step_report: rc=$rc in $(( $(date +%s) - t_all )) s"
exit $rc
