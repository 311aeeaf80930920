#!/usr/bin/env python3
"""Turns the JSON of one device run (bench_gemm.json, torch_grouped_mm.json) into the
markdown tables of bench/RESULTS.md.   python3 bench/results_tables.py bench_gemm.json"""
import json
import sys


def main(path):
    d = json.load(open(path))
    c = d["ceilings"]
    print(f"Ceilings (same run): copy {c['copy_gbps']:.0f} GB/s (D2D, read+write), "
          f"BF16 {c['bf16_tflops']:.0f} TFLOP/s (cuBLASLt 8192³). {d['gpu']}, commit {d['commit'][:7]}, {d['date']}.\n")
    for op in d["ops"]:
        print(f"### {op['op']} (N={op['n']}, K={op['k']}, epilogue {op['epilogue']}), E={op['experts']}, top-{op['top_k']}\n")
        print("| T | hit | byte floor µs | ours µs | config | TFLOP/s | % copy BW | % BF16 peak | dequant+cuBLAS µs | × cuBLAS | torch._grouped_mm µs | × torch | Generic µs |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in op["results"]:
            cfg = {x["name"]: x for x in r["configs"]}
            ours = cfg[r["ours"]["name"]]
            gen = next((x for x in r["configs"] if x["family"] == "generic"), None)
            tus = r["ours"]["us"] * r["speedup_vs_torch"] if r.get("speedup_vs_torch") else None
            torch_us = f"{tus:.1f}" if tus else "-"
            torch_x = f"{r['speedup_vs_torch']:.2f}×" if tus else "-"
            gen_us = f"{gen['us']:.1f}" if gen and gen.get("us") else "-"
            print(f"| {r['T']} | {r['hit']} | {r['byte_floor_us']:.1f} | {ours['us']:.1f} | {ours['name']} | "
                  f"{ours['tflops']:.1f} | {ours['pct_copy_bw']:.1f} % | {ours['pct_bf16_peak']:.1f} % | "
                  f"{r['cublas']['us']:.1f} | {r['speedup_vs_cublas']:.2f}× | {torch_us} | {torch_x} | {gen_us} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
