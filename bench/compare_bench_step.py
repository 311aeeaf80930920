#!/usr/bin/env python3
"""After / before table of `fp4moe bench step --json` runs (issue 38's no-regression check).

Each side may have several runs (alternated on one machine); a cell is the median over them.
Prints a markdown table: decode ms per step by (batch, ctx) and K, prefill ms by tokens, and the
start-up seconds parsed from the logs' "start-up" line, with after / before ratios. A ratio above
1.03 (the issue's 3 % bound) is marked "REGRESSION".
"""
import argparse
import json
import re
import statistics


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    return runs


def cells(runs):
    out = {}
    for j in runs:
        for d in j.get("decode", []):
            out.setdefault(("decode", d["batch"], d["ctx"], 0), []).append(d["ms_per_step"])
            for k, ms in d.get("k_ms_per_step", {}).items():
                out.setdefault(("decode", d["batch"], d["ctx"], int(k)), []).append(ms)
        for p in j.get("prefill", []):
            out.setdefault(("prefill", p["tokens"]), []).append(p["ms"])
    return {k: statistics.median(v) for k, v in out.items()}


def startup(paths):
    vals = []
    for p in paths:
        with open(p, errors="replace") as f:
            for line in f:
                m = re.search(r"start-up \(load \+ plan \+ graphs\): ([0-9.]+) s", line)
                if m:
                    vals.append(float(m.group(1)))
                    break
    return statistics.median(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--before-logs", nargs="*", default=[])
    ap.add_argument("--after-logs", nargs="*", default=[])
    a = ap.parse_args()
    b, c = cells(load(a.before)), cells(load(a.after))
    print("| point | before ms | after ms | after / before |")
    print("|---|---|---|---|")
    worst = 0.0
    for k in sorted(set(b) & set(c), key=str):
        r = c[k] / b[k] if b[k] > 0 else float("nan")
        worst = max(worst, r)
        name = f"decode B {k[1]} ctx {k[2]}" + (f" K {k[3]} (per token step)" if k[3] else " (graph step)") if k[0] == "decode" else f"prefill {k[1]}"
        flag = " REGRESSION" if r > 1.03 else ""
        print(f"| {name} | {b[k]:.3f} | {c[k]:.3f} | {r:.3f}{flag} |")
    sb, sa = startup(a.before_logs), startup(a.after_logs)
    if sb and sa:
        print(f"| start-up s | {sb:.1f} | {sa:.1f} | {sa / sb:.3f} |")
    print(f"worst after / before: {worst:.3f}")


if __name__ == "__main__":
    main()
