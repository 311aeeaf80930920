#!/usr/bin/env bash
# Device step: Nsight Compute on the indexer's radix top-k kernels (topk_select_or_sample, topk_gather),
# through `fp4moe bench attention` at one batch x context (BF16 KV, decode, sparse path only;
# one timed run). Every top-k launch of the run is profiled (speed of light, launch stats,
# occupancy, warp states); the table $OUT/ncu_topk_B<B>_L<L>.csv has one row per launch:
# kernel, grid, duration, DRAM / L2 / SM throughput, printed as one line per launch. Run after
# tools/device/prebuilt_env.sh (or with build-dev/bin/fp4moe). Env: NCU_TOPK_CASES ("B:L ...",
# default "256:131072 64:32768 1:131072"); NCU_KERNELS, the kernel-name regex (default "topk_";
# "index_score|topk_" profiles the indexer's score kernel too); NCU_SASS=1 adds the source counters
# and writes, per case, the details page ($R_details.txt: warp stall reasons) and the SASS page with
# its per-instruction stall samples ($R_sass.csv), summarized by tools/device/ncu_sass_stalls.py
# ($R_stalls.txt: stall share per opcode, the hottest instructions); NCU_LAUNCHES (default 24) launches profiled.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
F=${FP4MOE_BIN:-build-dev/bin/fp4moe}
command -v ncu >/dev/null || { echo "no ncu"; exit 1; }
for c in ${NCU_TOPK_CASES:-256:131072 64:32768 1:131072}; do
  B=${c%%:*} L=${c##*:}; R=$OUT/ncu_topk_B${B}_L${L}
  extra=(); [ -n "${NCU_SASS:-}" ] && extra=(--section SourceCounters --section InstructionStats)
  timeout 240 ncu --clock-control none --kernel-name "regex:${NCU_KERNELS:-topk_}" --launch-count "${NCU_LAUNCHES:-24}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis "${extra[@]}" -o "$R" -f \
    "$F" bench attention --batch "$B" --ctx "$L" --kv bf16 --no-prefill --no-fp8-agreement --iters 1 > "$R.log" 2>&1
  echo "ncu topk B=$B L=$L rc=$?"
  ncu --import "$R.ncu-rep" --page raw --csv --metrics \
    launch__grid_size,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    > "$R.csv" 2>&1
  python3 - "$R.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) > 2:
    h = rows[0]
    for r in rows[2:]:
        d = dict(zip(h, r))
        f = lambda k: d.get(k, "")[:6]
        print(d["Kernel Name"].split("(")[0].split("::")[-1], d["Grid Size"], "us", f("gpu__time_duration.sum"),
              "dram%", f("dram__throughput.avg.pct_of_peak_sustained_elapsed"), "l2%", f("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
              "sm%", f("sm__throughput.avg.pct_of_peak_sustained_elapsed"))
PY
  grep -E '^\| topk' "$R.log"
  if [ -n "${NCU_SASS:-}" ]; then
    ncu --import "$R.ncu-rep" --page details > "${R}_details.txt" 2>&1
    ncu --import "$R.ncu-rep" --page source --csv --print-source sass > "${R}_sass.csv" 2>&1
    python3 tools/device/ncu_sass_stalls.py "${R}_sass.csv" > "${R}_stalls.txt" 2>&1 && head -40 "${R}_stalls.txt"
  fi
done
