#!/usr/bin/env bash
# Device step (run_all.sh): the GPU MoE layer at GLM-5 dimensions (default GEMM path, then
# the Generic fallback at three sizes for comparison), then the PyTorch BF16 reference
# layer (loop over experts, torch._grouped_mm) replaying the same per-expert token counts.
# Tables on stdout, JSON under $OUT/moe/.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/moe"
BIN=${FP4MOE_BIN:-build-dev/bin/fp4moe}
timeout 240 "$BIN" bench moe --json "$OUT/moe/bench_moe.json" "$@"
rc=$?
if [ $rc -ne 0 ]; then echo "bench moe failed: rc=$rc"; exit $rc; fi
timeout 120 "$BIN" bench moe --gemm generic --tokens 1,128,8192 --iters 10 --json "$OUT/moe/bench_moe_generic.json" \
  || echo "bench moe --gemm generic failed: rc=$?"
PYTHONUNBUFFERED=1 timeout 200 python3 bench/torch_moe.py --counts-json "$OUT/moe/bench_moe.json" \
  --json "$OUT/moe/torch_moe.json"
