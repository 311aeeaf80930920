#!/usr/bin/env bash
# Device step: Nsight Compute on our MLA decode kernel (mla_decode_kernel: the mma.sync and wgmma
# variants, planned and device-scheduled) through `fp4moe bench attention --no-sparse` at one
# batch x context per KV type, one timed run each. Per KV type: the details page (speed of light,
# warp stall reasons, pipe utilization) as $R_details.txt, the per-launch summary, and the SASS
# stall samples summarized by tools/device/ncu_sass_stalls.py ($R_stalls.txt). Run after
# tools/device/prebuilt_env.sh. Env: NCU_DECODE_KV (default "bf16 fp8"), NCU_DECODE_CASE (B:L,
# default 64:8192), NCU_LAUNCHES (default 8).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
F=${FP4MOE_BIN:-build-dev/bin/fp4moe}
c=${NCU_DECODE_CASE:-64:8192}; B=${c%%:*} L=${c##*:}
for kv in ${NCU_DECODE_KV:-bf16 fp8}; do
  R=$OUT/ncu_decode_${kv}_B${B}_L${L}
  timeout 280 ncu --clock-control none --kernel-name "regex:mla_decode_kernel" --launch-count "${NCU_LAUNCHES:-8}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters \
    --section InstructionStats -o "$R" -f \
    "$F" bench attention --batch "$B" --ctx "$L" --kv "$kv" --no-sparse --no-prefill --no-fp8-agreement \
    --no-key-writes --iters 1 > "$R.log" 2>&1
  echo "ncu decode kv=$kv B=$B L=$L rc=$?"
  ncu --import "$R.ncu-rep" --page details > "${R}_details.txt" 2>&1
  grep -E "mla_decode_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps" "${R}_details.txt" | head -n 80
  ncu --import "$R.ncu-rep" --page source --csv --print-source sass > "${R}_sass.csv" 2>/dev/null
  python3 tools/device/ncu_sass_stalls.py "${R}_sass.csv" --top 20 > "${R}_stalls.txt" 2>&1
  head -n 60 "${R}_stalls.txt"
  rm -f "${R}_sass.csv" "$R.ncu-rep"
done
