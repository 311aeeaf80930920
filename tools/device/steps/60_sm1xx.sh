#!/usr/bin/env bash
# Device step (run_all.sh, after build-dev/ is built): what of the Blackwell path can run on the
# H200 (the sm_100a / sm_120a GEMMs themselves are compiled, not run):
#   1. nvfp4_act_quant_test under compute-sanitizer memcheck, then plainly: the NVFP4 activation
#      quantizer (grouped and slab layouts, SiLU·up input) and the row pass against the CPU;
#   2. sm1xx_bs_args_test, sm1xx_block_quant_math_test (host arithmetic; CUTLASS-backed cases
#      skip in a 90a-only build);
#   3. sm1xx_moe_gemm_test: the launched Blackwell GEMMs against the CPU; on the H200 every case
#      skips ("needs an sm_120 / sm_100 GPU"); on an RTX PRO 6000 / B200 with build-dev configured for
#      -DCMAKE_CUDA_ARCHITECTURES=120a (or 100a) instead of 90a it is the correctness test of every built config;
#   4. expert_gemm_family_test: the MoE layer's Auto path is the arch -> family table's choice for
#      this GPU; on the H200 it must be the sm90 kernels (expect 1 test PASSED, not skipped).
# Expected run time: < 1 min.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/sm1xx"
O=$OUT/sm1xx
rc=0
for t in nvfp4_act_quant_test sm1xx_bs_args_test sm1xx_block_quant_math_test sm1xx_moe_gemm_test expert_gemm_family_test; do
  [ -x build-dev/bin/$t ] || bash tools/device/build.sh $t > "$O/build_$t.log" 2>&1
  B=build-dev/bin/$t
  [ -x "$B" ] || { echo "$t: not built"; rc=1; continue; }
  if [ $t = nvfp4_act_quant_test ] || [ $t = sm1xx_moe_gemm_test ]; then
    timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 "$B" > "$O/${t}_memcheck.log" 2>&1
    r=$?; echo "$t memcheck: rc=$r $(grep -E 'ERROR SUMMARY' "$O/${t}_memcheck.log" | tail -n 1)"; [ $r -eq 0 ] || rc=1
  fi
  timeout 120 "$B" > "$O/${t}.log" 2>&1
  r=$?; echo "$t: rc=$r $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$O/${t}.log" | tr '\n' ' ')"; [ $r -eq 0 ] || rc=1
  grep -E '^\[  FAILED  \]' "$O/${t}.log" | head -n 20
done
exit $rc
