#!/usr/bin/env bash
# Device step (run_all.sh): the GPU MoE layer at GLM-5 dimensions, then the PyTorch BF16
# reference layer (loop over experts, torch._grouped_mm) replaying the same per-expert
# token counts. Tables on stdout, JSON under $OUT/moe/ (bench_moe.json, torch_moe.json).
# FP4MOE_BENCH_MOE_GENERIC=1 adds the Generic-GEMM layer at T = 1, 128, 8192 (table only).
# Expected run time ~1-2 min (weights are generated on the host: ~5.5 GB).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/moe"
BIN=${FP4MOE_BIN:-build-dev/bin/fp4moe}
timeout 180 "$BIN" bench moe --json "$OUT/moe/bench_moe.json" "$@"
rc=$?
if [ $rc -ne 0 ]; then echo "bench moe failed: rc=$rc"; exit $rc; fi
if [ "${FP4MOE_BENCH_MOE_GENERIC:-0}" = 1 ]; then
  timeout 90 "$BIN" bench moe --gemm generic --tokens 1,128,8192 --iters 10 || echo "bench moe --gemm generic: rc=$?"
fi
PYTHONUNBUFFERED=1 timeout 150 python3 bench/torch_moe.py --counts-json "$OUT/moe/bench_moe.json" \
  --json "$OUT/moe/torch_moe.json"
