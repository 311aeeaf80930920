#!/usr/bin/env python3
"""Turns the JSON of `fp4moe bench attention --json` into the markdown tables of
bench/RESULTS.md, and with --plot PNG a chart of decode time per path against FlashInfer's
host-planned time (BF16 cache, dense and sparse).
    python3 bench/attention_tables.py bench_attention.json [--plot out.png]"""
import argparse
import json
import re


def fmt_us(x):
    return f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def main(path):
    d = json.load(open(path))
    c = d["ceilings"]
    rows = d["results"]
    print(f"Ceilings (same run): copy {c['copy_gbps']:.0f} GB/s (D2D, read+write), BF16 {c['bf16_tflops']:.0f} "
          f"TFLOP/s, FP8 {c['fp8_tflops']:.0f} TFLOP/s (cuBLASLt 8192³). {d['device']}, page size "
          f"{d['page_size']}, top-{d['top_k']}; cold L2, median.\n")
    for kv in ("bf16", "fp8_e4m3"):
        dec = [r for r in rows if r["kind"] == "decode" and r["kv"] == kv]
        if not dec:
            continue
        print(f"#### Dense decode, {kv} KV (64 heads, latent 512 + 64): µs / % of copy BW on the KV bytes / × byte floor\n")
        print("| path | B | ctx | µs | GB/s | TFLOP/s | % copy BW | × floor | note |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in dec:
            gbps = r["bytes"] / (r["us"] * 1e3)
            print(f"| {r['path']} | {r['batch']} | {r['ctx']} | {fmt_us(r['us'])} | {gbps:.0f} | "
                  f"{r['flops'] / (r['us'] * 1e6):.0f} | {100 * gbps / c['copy_gbps']:.1f} % | {r['x_floor']:.2f}× | "
                  f"{r.get('note', '')} |")
        print()
        sp = [r for r in rows if r["kv"] == kv and r["kind"] in ("indexer", "topk", "sparse-mla", "sparse-decode")]
        if sp:
            print(f"#### Sparse decode (DSA), {kv} KV: µs per stage, and the pipeline against its floor "
                  f"(2048 selected latents + the indexer keys)\n")
            print("| B | ctx | indexer µs (× floor) | top-k µs | sparse MLA µs (path) | pipeline µs (MLA path) | × floor | "
                  "one graph µs (× floor) | dense µs ÷ pipeline µs |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            keys = sorted({(r["batch"], r["ctx"]) for r in sp})
            for b, l in keys:
                here = [r for r in sp if r["batch"] == b and r["ctx"] == l]
                tks = {r["path"]: r for r in here if r["kind"] == "topk"}
                ixs = {r["path"]: r for r in here if r["kind"] == "indexer"}
                sds = [r for r in here if r["kind"] == "sparse-decode"]
                al = next((r for r in sds if not r["path"].startswith("graph:")), None)
                gr = next((r for r in sds if r["path"].startswith("graph:")), None)
                ix, tk = ixs.get("ours-mma"), tks.get("ours-radix")
                ix4 = ixs.get("ours-mma-4waves")
                wide, fi = tks.get("ours-radix-wide"), tks.get("flashinfer-topk")
                mls = [r for r in here if r["kind"] == "sparse-mla"]
                if not (ix and tk and al and mls):
                    continue
                ml = ", ".join(f"{fmt_us(m['us'])} ({m['path']})" for m in mls)
                tk_us = fmt_us(tk["us"]) + (f" (wide slices: {fmt_us(wide['us'])})" if wide else "") + \
                    (f" (FlashInfer: {fmt_us(fi['us'])})" if fi else "")
                ix_us = f"{fmt_us(ix['us'])} ({ix['x_floor']:.2f}×)" + \
                    (f" (4 waves: {fmt_us(ix4['us'])})" if ix4 else "")
                gr_us = f"{fmt_us(gr['us'])} ({gr['x_floor']:.2f}×)" if gr else "—"
                print(f"| {b} | {l} | {ix_us} | {tk_us} | "
                      f"{ml} | {fmt_us(al['us'])} ({al['path']}) | {al['x_floor']:.2f}× | {gr_us} | "
                      f"{al['note'].replace('vs dense ', '')} |")
            print()
    pre = [r for r in rows if r["kind"] in ("prefill", "prefill-dsa")]  # the DSA selection rows after their prefill
    if pre:
        print("#### Prefill (one fresh request, causal, chunks of ≤ 16K queries)\n")
        print("| kv | N | path | µs | TFLOP/s | % BF16 peak | note |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in pre:
            tf = r["flops"] / (r["us"] * 1e6)
            print(f"| {r['kv']} | {r['ctx']} | {r['path']} | {fmt_us(r['us'])} | {tf:.0f} | "
                  f"{100 * tf / c['bf16_tflops']:.1f} % | {r['note']} |")
        print()
    kw = [r for r in rows if r["kind"] == "key-writes"]
    if kw:
        print("#### Cache writes of a step's new tokens (BF16 cache): the runner's 5 unfused launches vs the fused 2\n")
        print("| requests | new tokens each | unfused µs (× floor) | fused µs (× floor) | fused ÷ unfused |")
        print("| --- | --- | --- | --- | --- |")
        for b, l in sorted({(r["batch"], r["ctx"]) for r in kw}):
            u = next((r for r in kw if (r["batch"], r["ctx"]) == (b, l) and r["path"].startswith("runner")), None)
            f = next((r for r in kw if (r["batch"], r["ctx"]) == (b, l) and r["path"].startswith("fused")), None)
            if u and f:
                print(f"| {b} | {l} | {fmt_us(u['us'])} ({u['x_floor']:.2f}×) | {fmt_us(f['us'])} ({f['x_floor']:.2f}×) | "
                      f"{f['us'] / u['us']:.2f}x |")
        print()
    if d.get("fp8_selection"):
        print("#### FP8 indexer: selected set against FP32 (top-2048 of 32K)\n")
        print("| data | rows | mean overlap | min overlap | identical sets |")
        print("| --- | --- | --- | --- | --- |")
        for a in d["fp8_selection"]:
            print(f"| {a['data']} | {a['rows']} | {100 * a['mean_overlap']:.2f} % | {100 * a['min_overlap']:.2f} % | "
                  f"{a['identical_rows']}/{a['rows']} |")
        print()


def plot(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in json.load(open(path))["results"] if r["kv"] == "bf16"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, kind, base in ((axes[0], "decode", "flashinfer-sm90"), (axes[1], "sparse-mla", "flashinfer-sm90-ps1")):
        mine = [r for r in rows if r["kind"] == kind]
        points = sorted({(r["batch"], r["ctx"]) for r in mine})
        planned = {(r["batch"], r["ctx"]): r["us"] for r in mine if r["path"] == base}
        # The forced split counts (-dev-s<n>) stay in the tables: as bars they crowd out the rest.
        paths = [p for p in dict.fromkeys(r["path"] for r in mine) if p != base and not re.search(r"-dev-s\d+$", p)]
        width = 0.8 / max(len(paths), 1)
        colors = plt.get_cmap("tab20").colors
        for i, p in enumerate(paths):
            us = {(r["batch"], r["ctx"]): r["us"] for r in mine if r["path"] == p}
            xs = [j + i * width for j, k in enumerate(points) if k in us and k in planned]
            ys = [us[k] / planned[k] for k in points if k in us and k in planned]
            ax.bar(xs, ys, width, label=p, color=colors[i % len(colors)])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(points))])
        ax.set_xticklabels([f"B{b}\n{l // 1024}K" for b, l in points], fontsize=7)
        ax.set_ylabel(f"time / {base} (host-planned)")
        ax.set_title(f"{kind}, BF16 KV: lower is faster")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--plot", help="write the decode chart to this PNG")
    a = ap.parse_args()
    main(a.json)
    if a.plot:
        plot(a.json, a.plot)
