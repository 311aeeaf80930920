#!/usr/bin/env python3
"""The ratios behind the attention defaults, from one `fp4moe bench attention --json` run: per
B x ctx, dense decode (FlashInfer against the copy floor and a plain copy of the same bytes; ours
and its wgmma variant against it; FlashInfer's split rule against its best forced split count)
and the sparse pipeline (its one-graph time against the byte floor and the floor kernels' chain;
programmatic launch; the top-k variants against the default radix top-k). Markdown to stdout.
    python3 bench/attention_decisions.py bench_attention.json [--kv bf16|fp8_e4m3]"""
import argparse
import json


def main(path, kv):
    with open(path) as f:
        d = json.load(f)
    copy = d["ceilings"]["copy_gbps"]
    R = {(r["kind"], r["kv"], r["path"], r["batch"], r["ctx"]): r for r in d["results"]}
    cases = sorted({(k[3], k[4]) for k in R if k[1] == kv})

    def get(kind, path, B, L):
        return R.get((kind, kv, path, B, L))

    def matching(kind, B, L, pred):  # the point's rows of `kind` whose path satisfies pred
        return [r for k, r in R.items() if k[0] == kind and k[1] == kv and k[3] == B and k[4] == L and pred(k[2])]

    def first(kind, B, L, pred):
        return next(iter(matching(kind, B, L, pred)), None)

    print(f"{d['device']}, commit {d['commit']}, L2 flush {d['l2_flush']}, {kv} cache\n")
    print("| B | ctx | FlashInfer µs | % copy BW | ÷ floor-move | ours-mma ÷ FlashInfer | ours-wgmma ÷ ours-mma | "
          "FlashInfer's split rule ÷ best forced |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for B, L in cases:
        fi, fm = get("decode", "flashinfer-sm90", B, L), get("decode", "floor-move", B, L)
        om, ow, fd = get("decode", "ours-mma", B, L), get("decode", "ours-wgmma", B, L), get("decode", "flashinfer-sm90-dev", B, L)
        if not (fi and fm and om and ow and fd):
            continue
        forced = [r["us"] for r in matching("decode", B, L, lambda p: p.startswith("flashinfer-sm90-dev-s"))]
        pct = 100 * fi["bytes"] / (fi["us"] * 1e3) / copy
        rule = f"{fd['us'] / min(forced):.2f}" if forced else "–"
        print(f"| {B} | {L} | {fi['us']:.1f} | {pct:.1f} % | {fi['us'] / fm['us']:.2f} | {om['us'] / fi['us']:.2f} | "
              f"{ow['us'] / om['us']:.2f} | {rule} |")
    print()
    print("| B | ctx | pipeline, one graph µs | its MLA | × byte floor | floor-chain3 × floor | ÷ floor-chain<n> | "
          "+PDL ÷ graph | indexer × floor | top-k in the pipeline | 1cta32k | sample64 | sample128 | FlashInfer top-k |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for B, L in cases:
        gr = first("sparse-decode", B, L, lambda p: p.startswith("graph:"))
        pdl = first("sparse-decode", B, L, lambda p: p.startswith("graph+pdl:"))
        st = first("sparse-decode", B, L, lambda p: "+topk+" in p and ":" not in p)
        ch3 = get("sparse-decode", "floor-chain3", B, L)
        chn = first("sparse-decode", B, L, lambda p: p.startswith("floor-chain") and p != "floor-chain3") or ch3
        ix, rad = get("indexer", "ours-mma", B, L), get("topk", "ours-radix", B, L)
        if not (gr and pdl and st and ch3 and ix and rad):
            continue

        def vs_radix(p):
            r = get("topk", p, B, L)
            return f"{r['us'] / rad['us']:.2f}" if r else "–"

        print(f"| {B} | {L} | {gr['us']:.1f} | {gr['path'].split('+')[-1]} | {gr['x_floor']:.2f} | {ch3['x_floor']:.2f} | "
              f"{gr['us'] / chn['us']:.2f} | {pdl['us'] / gr['us']:.2f} | {ix['x_floor']:.2f} | "
              f"{st['note'].split('top-k ')[-1]} | {vs_radix('ours-radix-1cta32k')} | {vs_radix('ours-radix-sample64')} | "
              f"{vs_radix('ours-radix-sample128')} | {vs_radix('flashinfer-topk')} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--kv", default="bf16")
    a = ap.parse_args()
    main(a.json, a.kv)
