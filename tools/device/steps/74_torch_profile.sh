#!/usr/bin/env bash
# Device step: where the PyTorch baseline's decode step spends its time (bench/torch_serve/profile_step.py)
# on the sweep's model (GLM-5 dims, 1 dense + 1 MoE layer, made by 80_serve_sweep / 72_torch_serve_smoke
# and kept in /tmp while the machine is warm; made here if missing).
#   NO_TESTS=1 BUILD_TARGETS=fp4moe bash tools/device/run_all.sh 74_torch_profile
# Env: TP_MODEL (/tmp/fp4moe_glm5_L2), TP_BATCH (16,64,256), TP_CONTEXT (1536: the mean context of a
# 1K in / 1K out request), TP_KV (latent,expanded), TP_STEPS (3).
# Look for: "ms per decode step" against the sweep's TPOT at the same cap, and the profiler tables.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; O=$OUT/torch_profile; mkdir -p "$O"
MODEL=${TP_MODEL:-/tmp/fp4moe_glm5_L2}
if [ ! -f "$MODEL/config.json" ]; then
  [ -x build-dev/bin/fp4moe ] || bash tools/device/build.sh fp4moe > "$O/build_fp4moe.log" 2>&1
  t0=$(date +%s)
  timeout 300 build-dev/bin/fp4moe make-synthetic "$MODEL" --preset glm5-layer --layers 2 --dense-layers 1 \
    > "$O/make_synthetic.log" 2>&1
  r=$?; echo "make-synthetic: rc=$r in $(( $(date +%s) - t0 )) s"
  [ $r -eq 0 ] || { rm -rf "$MODEL"; tail -n 5 "$O/make_synthetic.log"; exit 1; }
fi
timeout ${TP_TIMEOUT_S:-300} python3 bench/torch_serve/profile_step.py --model "$MODEL" --batch "${TP_BATCH:-16,64,256}" \
  --context "${TP_CONTEXT:-1536}" --kv-cache "${TP_KV:-latent,expanded}" --steps "${TP_STEPS:-3}" 2>&1 | tee "$O/profile.log"
rc=${PIPESTATUS[0]}
grep -E 'ms per decode step|ms per step|GPU time in|skipped' "$O/profile.log" | sed 's/^/| /'
exit $rc
