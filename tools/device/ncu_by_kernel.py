#!/usr/bin/env python3
"""ncu's CSV (--csv --print-units base --metrics gpu__time_duration.sum) aggregated per kernel name.

    ncu_by_kernel.py FILE.csv [--after-name SUBSTR] [--top N]

--after-name: count only the kernels from the first one whose name contains SUBSTR (e.g. the
embedding that starts a step, after the start-up's upload kernels). Prints a markdown table:
kernel (name cut at its template arguments), launches, total µs, share, µs per launch.
"""
import argparse
import collections
import csv
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--after-name", default="")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit)
        if scale is None:
            print(f"ncu_by_kernel: unknown unit {unit!r}", file=sys.stderr)
            return 1
        rows.append((int(r["ID"]), r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale))
    rows.sort()
    if a.after_name:
        first = next((i for i, (_, n, _) in enumerate(rows) if a.after_name in n), None)
        if first is None:
            print(f"ncu_by_kernel: no kernel named *{a.after_name}*", file=sys.stderr)
            return 1
        rows = rows[first:]
    by = collections.defaultdict(lambda: [0, 0.0])
    for _, name, us in rows:
        short = name.split("(")[0].split("<")[0].strip() or name[:60]
        key = short if len(short) > 3 else name[:80]
        by[key][0] += 1
        by[key][1] += us
    total = sum(v[1] for v in by.values())
    print(f"{len(rows)} kernels, {total:.1f} µs in all")
    print("| kernel | launches | µs | share % | µs / launch |")
    print("|---|---|---|---|---|")
    for k, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"| `{k[:70]}` | {n} | {us:.1f} | {100 * us / total:.1f} | {us / n:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
