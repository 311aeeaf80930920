#!/usr/bin/env bash
# Device step: Nsight Compute on the sm90 grouped GEMM in the decode regime (the decode kernel, block_n 8,
# gate_up, T = 1 and T = 128), one timed launch each (the 5th: after warm-up), full section
# set; reports to $OUT/ncu_T*.ncu-rep, the key metrics as text to $OUT/ncu_T*.txt.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${MOE_GEMM_TEST:-build-dev/bin/moe_gemm_test}
command -v ncu >/dev/null || { echo "no ncu"; exit 1; }
for T in ${NCU_TOKENS:-1 128}; do
  FP4MOE_PERF_T=$T FP4MOE_PERF_CONFIG=${NCU_CONFIG:-sm90_decode_m128n8k} FP4MOE_PERF_OP=${NCU_OP:-gate_up} \
    timeout 240 ncu --clock-control none --kernel-name regex:sm90_fp4_grouped_gemm --launch-skip 4 --launch-count 1 \
    --set full --import-source no -o "$OUT/ncu_T$T" -f \
    "$B" --gtest_also_run_disabled_tests --gtest_filter='*Perf*' > "$OUT/ncu_T$T.log" 2>&1
  echo "ncu T=$T rc=$?"
  ncu --import "$OUT/ncu_T$T.ncu-rep" --page details > "$OUT/ncu_T$T.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Issued Ipc Active|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|Active Warps Per Scheduler|Eligible Warps" "$OUT/ncu_T$T.txt" | head -n 20
done
for T in ${NCU_TOKENS:-1 128}; do
  ncu --import "$OUT/ncu_T$T.ncu-rep" --page raw 2>/dev/null | grep -E "smsp__average_warp(s|_latency)_issue_stalled|smsp__pcsamp_warps_issue_stalled" \
    | awk '$NF+0 > 0' > "$OUT/ncu_T${T}_stalls.txt"
done
