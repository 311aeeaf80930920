#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): the server on the GPU host: engine + serve
# unit tests, then the openai-client end-to-end suite (tests/serve/openai_e2e_test.py: every fake-
# and cpu-backend case, and with FP4MOE_E2E_CUDA=1 the --backend cuda cases on the GPU runner).
# The openai package comes from the carried wheels (.carry/wheels, prepare_carry.sh) when the
# machine's python lacks it. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
cmake --build build-dev -j "$(nproc)" --target fp4moe scheduler_test engine_test api_request_test choice_output_test \
  > "$OUT/serve_build.log" 2>&1 || { echo "serve build failed"; tail -n 20 "$OUT/serve_build.log"; exit 1; }
for t in scheduler_test engine_test api_request_test choice_output_test; do
  timeout 120 "build-dev/bin/$t" > "$OUT/$t.log" 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
done
if ! python3 -c 'import openai' 2>/dev/null && [ -d .carry/wheels ]; then
  python3 -m pip install -q --no-index --find-links .carry/wheels --target .carry/pylib openai==2.8.1 \
    > "$OUT/pip_openai.log" 2>&1 || tail -n 5 "$OUT/pip_openai.log"
  export PYTHONPATH=$PWD/.carry/pylib${PYTHONPATH:+:$PYTHONPATH}
fi
FP4MOE_E2E_CUDA=1 timeout 280 python3 tests/serve/openai_e2e_test.py build-dev/bin/fp4moe > "$OUT/serve_e2e.log" 2>&1
echo "serve e2e rc=$? (77 = openai not installed): $(tail -n 1 "$OUT/serve_e2e.log")"
