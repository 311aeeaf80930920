#!/usr/bin/env bash
# The main job on the embedded default backend (CPU): make a small random GLM-5-architecture
# NVFP4 checkpoint (ModelOpt layout), describe it, and run one MoE layer's forward pass.
#   ./demo.sh              uses build/bin/fp4moe (./setup.sh builds it) and /tmp/fp4moe-demo
# Environment: BUILD_DIR (default build), FP4MOE_DEMO_DIR (default /tmp/fp4moe-demo),
#              PRESET (glm5-tiny, default; glm5-tiny-shared, deepseek-v3-tiny; glm5-layer = GLM-5's
#              real dims, 1 dense + 1 MoE layer, ~10 GB on disk).
set -euo pipefail
cd "$(dirname "$0")"
BIN=${BUILD_DIR:-build}/bin/fp4moe
WORK=${FP4MOE_DEMO_DIR:-/tmp/fp4moe-demo}
PRESET=${PRESET:-glm5-tiny}
MODEL=$WORK/$PRESET
if [ ! -x "$BIN" ]; then
  echo "demo.sh: $BIN not found: run ./setup.sh first" >&2
  exit 1
fi
mkdir -p "$WORK"
echo "== fp4moe make-synthetic $MODEL --preset $PRESET"
"$BIN" make-synthetic "$MODEL" --preset "$PRESET" --seed 0
echo "== fp4moe inspect $MODEL"
"$BIN" inspect "$MODEL"
echo "== fp4moe run-moe (layer 1, 16 tokens from sample_input.safetensors, CPU backend)"
"$BIN" run-moe --model "$MODEL" --layer 1 --input "$MODEL/sample_input.safetensors" \
  --output "$WORK/moe_out.safetensors" --backend cpu
echo "== wrote $WORK/moe_out.safetensors (output [16, hidden] F32, topk_ids [16, k] I32, topk_weights [16, k] F32)"
