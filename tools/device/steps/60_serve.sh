#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): the server on the GPU host. Until the
# GPU runner lands it checks that fp4moe serve builds and runs there with the carried
# cpp-httplib (engine + serve unit tests, then the openai-client end-to-end test on
# --backend fake when the openai package is present; exit 77 = skipped). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
cmake --build build-dev -j "$(nproc)" --target fp4moe scheduler_test engine_test api_request_test choice_output_test \
  > "$OUT/serve_build.log" 2>&1 || { echo "serve build failed"; tail -n 20 "$OUT/serve_build.log"; exit 1; }
for t in scheduler_test engine_test api_request_test choice_output_test; do
  timeout 120 "build-dev/bin/$t" > "$OUT/$t.log" 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
done
timeout 300 python3 tests/serve/openai_e2e_test.py build-dev/bin/fp4moe > "$OUT/serve_e2e.log" 2>&1
echo "serve e2e rc=$? (77 = openai not installed): $(tail -n 1 "$OUT/serve_e2e.log")"
