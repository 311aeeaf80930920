#!/usr/bin/env python3
"""Summarize the per-instruction warp-stall samples of an ncu SASS page.

Input: the CSV that `ncu --import R.ncu-rep --page source --csv --print-source sass` writes
(tools/device/steps/52_ncu_topk.sh with NCU_SASS=1 leaves it as $R_sass.csv). The file holds one
table per profiled kernel launch, each starting with its own header row. For each table this
prints the share of stall samples per opcode and the hottest instructions.

    python3 tools/device/ncu_sass_stalls.py out/ncu_topk_B1_L131072_sass.csv [--top 25]
"""
import argparse
import collections
import csv
import sys


def tables(path):
    """Yield (kernel title, rows as dicts) per launch table in the CSV."""
    title, header, rows = "", None, []
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if "Source" in rec and any("Sampling" in c for c in rec):
                if header is not None and rows:
                    yield title, rows
                header, rows = rec, []
                continue
            if header is None or len(rec) != len(header):
                if len(rec) == 1 or (rec and rec[0].startswith("Kernel")):
                    title = " ".join(rec)[:120]
                continue
            rows.append(dict(zip(header, rec)))
    if header is not None and rows:
        yield title, rows


def number(s):
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25, help="hottest instructions to list per launch")
    a = ap.parse_args()
    n = 0
    for title, rows in tables(a.csv):
        n += 1
        cols = rows[0].keys()
        all_col = next((c for c in cols if "Sampling (All" in c), None)
        if all_col is None:
            all_col = next(c for c in cols if "Sampling" in c)
        addr_col = next((c for c in cols if c.startswith("Address")), None)
        total = sum(number(r[all_col]) for r in rows) or 1.0
        by_op = collections.Counter()
        for r in rows:
            op = r["Source"].strip().split()
            op = [t for t in op if not t.startswith("@")]
            by_op[op[0].split(".")[0] if op else "?"] += number(r[all_col])
        print(f"== launch {n} {title}: {int(total)} samples")
        print("  by opcode: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_op.most_common(12)))
        hot = sorted(rows, key=lambda r: -number(r[all_col]))[: a.top]
        for r in hot:
            share = 100 * number(r[all_col]) / total
            if share < 0.3:
                break
            addr = r.get(addr_col, "") if addr_col else ""
            print(f"  {share:5.1f}%  {addr:>6}  {r['Source'].strip()[:100]}")
    if n == 0:
        sys.exit(f"ncu_sass_stalls: no SASS table with stall samples in {a.csv}")


if __name__ == "__main__":
    main()
