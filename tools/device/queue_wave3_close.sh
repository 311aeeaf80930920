#!/usr/bin/env bash
# What issues 39, 40 and 43 still need from the GPU, in one device call, most needed first, for
# sessions where machines rarely start (carry [".pre"], packed by pack_prebuilt.sh):
#   1. the GPU tests carried, in two lanes, while make-synthetic writes the 5-layer GLM-5-dims
#      checkpoint (/tmp/glm5-runner) in the background (queue_prebuilt_tests.sh);
#   2. queue_step_report.sh's parts in CLOSE_PARTS order (default "step fp8 moe gemm ncu": issue 43's
#      table with its ceilings, the FP8 cache's kernel choice against FlashInfer and BF16);
#   3. queue_mini_spec.sh (issue 39: the deferral of plain rounds' MTP steps on the trained model);
# each part only when the call's time left (CALL_LIMIT_S, default 570) covers its estimate, so a
# call that is cut short still returns whole parts. A second call on the warm machine runs what
# the first skipped (CLOSE_TESTS=0 CLOSE_PARTS="..." CLOSE_SPEC=1).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s); END=$(( T0 + ${CALL_LIMIT_S:-570} ))
OUT=${OUT:-$PWD/out}; export OUT
left() { echo $(( END - $(date +%s) )); }
if [ "${CLOSE_TESTS:-1}" = 1 ]; then
  MAKE_MODEL=1 TEST_LANES=2 TEST_LIMIT_S=${TEST_LIMIT_S:-150} timeout $(( $(left) - 60 )) \
    bash tools/device/queue_prebuilt_tests.sh "$@"
  echo "tests: rc=$? at $(( $(date +%s) - T0 )) s"
fi
source tools/device/prebuilt_env.sh
# Estimates (s) from the sixth session's H100 runs: one bench step process 10-30 s, bench moe and
# gemm ~40 s each, the ncu prefill ~120 s.
declare -A need=([step]=60 [fp8]=90 [moe]=45 [gemm]=50 [ncu]=150)
for p in ${CLOSE_PARTS:-step fp8 moe gemm ncu}; do
  l=$(left)
  if [ "$l" -lt "${need[$p]:-60}" ]; then echo "== part $p skipped: $l s left"; continue; fi
  REPORT_PARTS=$p timeout $(( l - 5 )) bash tools/device/queue_step_report.sh | grep -vE '^(NVIDIA|commit )'
done
if [ "${CLOSE_SPEC:-1}" = 1 ]; then
  l=$(left)
  if [ "$l" -lt 120 ]; then echo "== mini spec skipped: $l s left"
  else SPEC_SIDES=${SPEC_SIDES:-plain specoff} SPEC_CONC=${SPEC_CONC:-16 64} timeout $(( l - 5 )) bash tools/device/queue_mini_spec.sh
  fi
fi
echo "queue_wave3_close: done at $(( $(date +%s) - T0 )) s"
# A call returns 8 files at most (chosen by name, not by need): every log in one archive instead.
if [ "${CLOSE_PACK_LOGS:-1}" = 1 ]; then
  tar czf /tmp/wave3_close_logs.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/wave3_close_logs.tgz "$OUT/"
fi
