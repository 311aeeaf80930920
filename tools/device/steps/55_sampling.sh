#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): the device sampler and the multi-step
# decode bookkeeping (src/cuda/sampling/).
#   1. sampling_test under compute-sanitizer memcheck (the decode_advance and K-step cases),
#      then the whole sampling_test (GPU == cpu::sample_cpu per row where cpu::stable_draw holds,
#      alone == batched, graph == eager), the CPU sampler's tests (sampling_cpu_test) and the
#      kernels in the CUDA emulator (sampling_emu_test);
#   2. `fp4moe bench sampling` (vocab 154,880, rows 1..1024, four parameter mixes) against
#      reading the logits once at copy bandwidth; table rows start with '|'.
# Expected run time: ~1-2 min tests + ~1 min bench. Env: SAMPLING_BENCH_ARGS (extra bench flags).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/sampling"
O=$OUT/sampling
TESTS="sampling_test sampling_cpu_test sampling_emu_test"
for t in $TESTS fp4moe; do [ -x build-dev/bin/$t ] || bash tools/device/build.sh $t > "$O/build_$t.log" 2>&1; done
rc=0
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build-dev/bin/sampling_test \
  --gtest_filter='DecodeAdvance*:SamplingGpu.BadArguments*' > "$O/sampling_memcheck.log" 2>&1
r=$?; echo "sampling_test memcheck: rc=$r $(grep -E 'ERROR SUMMARY' "$O/sampling_memcheck.log" | tail -n 1)"; [ $r -eq 0 ] || rc=1
for t in $TESTS; do
  B=build-dev/bin/$t
  [ -x "$B" ] || { echo "$t: not built"; rc=1; continue; }
  timeout 300 "$B" > "$O/${t}.log" 2>&1
  r=$?; echo "$t: rc=$r $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$O/${t}.log" | tr '\n' ' ')"; [ $r -eq 0 ] || rc=1
  grep -E '^\[  FAILED  \]|Failure|near tie' "$O/${t}.log" | head -n 30
done
timeout 300 build-dev/bin/fp4moe bench sampling ${SAMPLING_BENCH_ARGS:-} 2>&1 | tee "$O/bench_sampling.log"
r=${PIPESTATUS[0]}; echo "bench sampling: rc=$r"; [ $r -eq 0 ] || rc=1
exit $rc
