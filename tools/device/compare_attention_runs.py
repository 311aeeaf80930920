#!/usr/bin/env python3
"""Per-row comparison of `fp4moe bench attention --json` runs: µs and × floor of each run, and
each run's time over the first one's, for every (kind, path, batch, ctx) row of the first run.

    python3 tools/device/compare_attention_runs.py out/attention_l2_read.json out/attention_l2_write.json out/prev_read.json
"""
import json
import sys


def load(path):
    j = json.load(open(path))
    return j, {(r["kind"], r["path"], r["batch"], r["ctx"], r["kv"]): r for r in j["results"]}


def main(paths):
    if len(paths) < 2:
        sys.exit(__doc__)
    runs = [load(p) for p in paths]
    for p, (j, _) in zip(paths, runs):
        c = j["ceilings"]
        print(f"{p}: commit {j.get('commit')}, L2 flush {j.get('l2_flush', 'write')}, copy {c['copy_gbps']:.0f} GB/s")
    head = f"{'kind':13} {'path':34} {'kv':8} {'B':>4} {'ctx':>7}" + "".join(
        f" | run{i} us  x floor" + ("" if i == 0 else f"  /run0") for i in range(len(runs)))
    print(head)
    first = runs[0][1]
    for k in sorted(first, key=lambda k: (k[4], k[3], k[2], k[0], k[1])):
        line = f"{k[0]:13} {k[1]:34} {k[4]:8} {k[2]:4} {k[3]:7}"
        for i, (_, rows) in enumerate(runs):
            r = rows.get(k)
            if r is None:
                line += " | " + " " * (17 + (0 if i == 0 else 8))
                continue
            line += f" | {r['us']:9.1f} {r['x_floor']:6.2f}"
            if i:
                line += f"  {r['us'] / first[k]['us']:6.2f}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
