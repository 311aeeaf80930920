#!/usr/bin/env bash
# Issue 39 on the GPU, before / after in one call: queue_mini_spec.sh's serve part (SPEC_SIDES,
# default "plain specoff", at SPEC_CONC "16 64") with the carried .pre/before_fp4moe (its commit in
# .pre/BEFORE_COMMIT) and then with .pre/fp4moe, each side's bench serve lines, ITL percentiles
# and /metrics; then the carried GPU test binaries (GPU tests of the change).
#   carry [".pre"]; bash tools/device/queue_spec_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
source tools/device/prebuilt_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/spec_before && ln -sf "$PRE_BIN/before_fp4moe" /tmp/spec_before/fp4moe
for which in before after; do
  bd=$PRE_BIN; c=$FP4MOE_COMMIT
  [ $which = before ] && { bd=/tmp/spec_before; c=$(cat .pre/BEFORE_COMMIT 2>/dev/null); }
  echo "=== $which ($c)"
  OUT=$OUT/$which PRE_BIN=$bd SPEC_SIDES=${SPEC_SIDES:-plain specoff} SPEC_CONC=${SPEC_CONC:-16 64} \
    timeout ${AB_LIMIT_S:-200} bash tools/device/queue_mini_spec.sh 2>&1 | grep -E '^\[|lossless|DIFFERS|structured output|fp4moe_spec_(verify|disabled)'
  python3 - "$OUT/$which/mini_spec" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.jsonl")):
    for l in open(f):
        d = json.loads(l)
        print(f"  {f.split('/')[-1][6:-6]} c {d['max_concurrency']}: {d['output_throughput']:.0f} tok/s, ITL median / p95 / p99 / max "
              f"{d['median_itl_ms']:.2f} / {d['p95_itl_ms']:.2f} / {d['p99_itl_ms']:.2f} / {d['max_itl_ms']:.1f} ms, TTFT median {d['median_ttft_ms']:.0f} ms")
PY
done
for t in "$PRE_BIN"/*_test; do
  [ -x "$t" ] || continue
  (cd /tmp && timeout 200 "$t") > "$OUT/$(basename "$t").log" 2>&1
  echo "$(basename "$t"): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$(basename "$t").log" | tr '\n' ' ')"
done
