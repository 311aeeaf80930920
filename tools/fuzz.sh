#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in their own build dir and fuzzes them for a
# bounded time from the committed seed corpus. The targets, their -max_len and their seed
# scripts are listed in fuzz/targets.txt (the one list; fuzz/README.md).
#
#   tools/fuzz.sh [SECONDS] [TARGET]     one target (default 60 s, safetensors_header; also TARGET [SECONDS])
#   tools/fuzz.sh --all [SECONDS]        every target of fuzz/targets.txt, SECONDS each (default 45),
#                                        then a table: executions, corpus size, findings
#   tools/fuzz.sh --seeds [TARGET ...]   rewrite fuzz/corpus/<t>/seed_* and fuzz/dicts/<t>.dict
#                                        from tools/<dir>/fuzz_seeds.py (then commit them)
# Environment: FUZZ_BUILD_DIR (build-fuzz), FUZZ_JOBS (2), FUZZ_ARTIFACTS (<build>/artifacts).
#
# Each run first replays fuzz/corpus/<t>/regressions/* (inputs that once failed), then fuzzes
# from fuzz/corpus/<t>/ into a working corpus <build>/corpus/<t>/ (never into the repository).
# Exit status: 0 when nothing was found; otherwise non-zero, with the failing input saved under
# the artifact dir (printed). Keep it as a regression test: copy it to
# fuzz/corpus/<t>/regressions/ and commit it with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FUZZ_BUILD_DIR:-build-fuzz}"
artifacts="${FUZZ_ARTIFACTS:-$build/artifacts}"
list=fuzz/targets.txt

targets() { grep -vE '^\s*(#|$)' "$list" | awk '{print $1}'; }
field() {  # field TARGET COLUMN
  local v
  v=$(grep -vE '^\s*(#|$)' "$list" | awk -v t="$1" -v c="$2" '$1 == t {print $c}')
  [[ -n "$v" ]] || { echo "unknown fuzz target '$1' (fuzz/targets.txt: $(targets | tr '\n' ' '))" >&2; exit 2; }
  echo "$v"
}

seeds() {  # seeds TARGET: the committed corpus and dictionary from the target's seed script
  local t=$1 dir
  dir=$(field "$t" 3)
  mkdir -p "fuzz/corpus/$t" fuzz/dicts
  find "fuzz/corpus/$t" -maxdepth 1 -type f -delete  # regressions/ stays
  python3 "tools/$dir/fuzz_seeds.py" "$t" "fuzz/corpus/$t" "fuzz/dicts/$t.dict"
  echo "seeds $t: $(find "fuzz/corpus/$t" -maxdepth 1 -type f | wc -l) files, $(du -sb "fuzz/corpus/$t" | cut -f1) bytes"
}

build_targets() {  # build_targets TARGET ...
  local cxx cc
  cxx="$(command -v clang++-14 || command -v clang++)"
  cc="$(command -v clang-14 || command -v clang)"
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
      -DFP4MOE_FUZZ=ON -DFP4MOE_CUDA=OFF -DFP4MOE_TESTS=OFF >/dev/null
  fi
  local names=()
  for t in "$@"; do names+=("${t}_fuzz"); done
  cmake --build "$build" -j"${FUZZ_JOBS:-2}" --target "${names[@]}"
}

# fuzz_one TARGET SECONDS: replay the regressions, fuzz, print one summary line; returns non-zero
# on a finding.
fuzz_one() {
  local t=$1 seconds=$2 max_len bin corpus work art log rc=0
  max_len=$(field "$t" 2)
  bin="$build/bin/${t}_fuzz"
  corpus="fuzz/corpus/$t"
  work="$build/corpus/$t"
  art="$artifacts/$t"
  log="$build/fuzz_$t.log"
  [[ -d "$corpus" ]] || { echo "$t: no committed corpus $corpus (tools/fuzz.sh --seeds $t)" >&2; return 2; }
  mkdir -p "$work" "$art"
  : > "$log"
  local regressions=()
  if [[ -d "$corpus/regressions" ]]; then
    mapfile -t regressions < <(find "$corpus/regressions" -type f | sort)
  fi
  if [[ ${#regressions[@]} -gt 0 ]]; then
    "$bin" -artifact_prefix="$art/" -timeout=25 "${regressions[@]}" >>"$log" 2>&1 || rc=$?
    [[ $rc -eq 0 ]] || echo "$t: a committed regression input (fuzz/corpus/$t/regressions/) fails again" >&2
  fi
  if [[ $rc -eq 0 ]]; then
    local dict=()
    [[ -f "fuzz/dicts/$t.dict" ]] && dict=(-dict="fuzz/dicts/$t.dict")
    "$bin" "$work" "$corpus" "${dict[@]}" -max_total_time="$seconds" -max_len="$max_len" -timeout=25 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/" >>"$log" 2>&1 || rc=$?
  fi
  local execs corp findings
  execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | tail -n 1 | awk '{print $2}')
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -n 1 | awk '{print $2}')
  findings=$(find "$art" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  printf '%-20s %4ss  exit %-3s  executions %-10s  corpus %-12s  regressions %-3s  findings %s\n' \
    "$t" "$seconds" "$rc" "${execs:-?}" "${corp:-?}" "${#regressions[@]}" "$findings"
  if [[ $rc -ne 0 ]]; then
    echo "FUZZ FAILURE ($t): log $log; the failing input is in $art/:" >&2
    ls -l "$art" >&2 || true
    grep -E 'ERROR: |runtime error|SUMMARY' "$log" | head -n 5 >&2 || true
    echo "keep it as a regression test: cp $art/<file> fuzz/corpus/$t/regressions/ && git add fuzz/corpus/$t/regressions" >&2
  fi
  return "$rc"
}

case "${1:-}" in
  --seeds)
    shift
    if [[ $# -eq 0 ]]; then mapfile -t all < <(targets); set -- "${all[@]}"; fi
    for t in "$@"; do seeds "$t"; done
    ;;
  --all)
    seconds="${2:-45}"
    mapfile -t all < <(targets)
    t0=$(date +%s)
    build_targets "${all[@]}"
    echo "fuzz build: $(( $(date +%s) - t0 )) s (${#all[@]} targets, $build)"
    failed=()
    for t in "${all[@]}"; do fuzz_one "$t" "$seconds" || failed+=("$t"); done
    echo "fuzz: ${#all[@]} targets in $(( $(date +%s) - t0 )) s; artifacts (failing inputs) in $artifacts/"
    if [[ ${#failed[@]} -gt 0 ]]; then echo "fuzz FAILED: ${failed[*]}" >&2; exit 1; fi
    ;;
  *)
    if [[ -n "${1:-}" && ! "$1" =~ ^[0-9]+$ ]]; then set -- "${2:-60}" "$1"; fi  # also: TARGET [SECONDS]
    seconds="${1:-60}"
    target="${2:-safetensors_header}"
    field "$target" 1 >/dev/null
    build_targets "$target"
    fuzz_one "$target" "$seconds"
    ;;
esac
