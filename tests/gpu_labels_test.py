#!/usr/bin/env python3
"""Checks the configured build's ctest list against the test sources:
  - every test of an executable whose source uses a GPU skip macro (FP4MOE_SKIP_WITHOUT_*())
    carries a "<layer>-gpu" label, so that the device script's `ctest -L gpu` selects it, and
    no other test carries one;
  - every test has a TIMEOUT (a hang must not run until CI's 90-minute kill).
Usage: gpu_labels_test.py BUILD_DIR TESTS_SOURCE_DIR"""
import json
import pathlib
import re
import subprocess
import sys

GPU_MACRO = re.compile(r"FP4MOE_SKIP_WITHOUT_[A-Z0-9_]+\(\)")


def main() -> int:
    build, tests_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    sources = {}
    for p in list(tests_dir.rglob("*_test.cpp")) + list(tests_dir.rglob("*_test.cu")):
        sources.setdefault(p.stem, p)
    out = subprocess.run(["ctest", "--test-dir", str(build), "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    tests = json.loads(out)["tests"]
    problems, gpu_execs, checked, not_built = [], set(), 0, []
    for t in tests:
        if t["name"].endswith("_NOT_BUILT"):  # gtest_discover_tests' stand-in (fails by itself)
            not_built.append(t["name"][: -len("_NOT_BUILT")])
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        if not props.get("TIMEOUT"):
            problems.append(f"{t['name']}: no TIMEOUT")
        cmd = t.get("command") or []
        if not cmd:
            continue
        exe = pathlib.Path(cmd[0]).name
        src = sources.get(exe)
        if src is None or cmd[0].endswith(".py") or "python" in exe:
            continue
        checked += 1
        needs_gpu = bool(GPU_MACRO.search(src.read_text(errors="replace")))
        has_gpu_label = any(l.endswith("-gpu") for l in labels)
        if needs_gpu:
            gpu_execs.add(exe)
        if needs_gpu and not has_gpu_label:
            problems.append(f"{t['name']} ({src.relative_to(tests_dir)} uses a GPU skip macro): labels {labels}, no '-gpu'")
        if has_gpu_label and not needs_gpu:
            problems.append(f"{t['name']} ({src.relative_to(tests_dir)} uses no GPU skip macro): labelled {labels}")
    print(f"{len(tests)} tests, {checked} gtest cases checked, {len(gpu_execs)} GPU executables: "
          f"{' '.join(sorted(gpu_execs)) or '-'}")
    if not_built:
        print(f"not built, unchecked: {' '.join(not_built)}")
    if checked == 0:
        problems.append("no gtest case found in the build (is it configured and built?)")
    for p in problems[:50]:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
