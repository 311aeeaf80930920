#!/usr/bin/env python3
"""Plot `fp4moe bench gemm --json` results: time against T, log-log, one panel per op.

Lines: our best sm90 config per T, the Generic fallback, the dequantize + cuBLAS baseline,
torch._grouped_mm BF16 (when the bench was given --torch-json), and the two floors: the
byte floor (bytes needed / measured copy bandwidth) and the compute floor (FLOPs /
measured BF16 peak).

  python3 bench/plot_gemm.py out/bench_gemm.json out/bench_gemm.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def best(configs, family):
    ok = [c for c in configs if c["family"] == family and not c.get("error") and c["us"] > 0]
    return min(ok, key=lambda c: c["us"]) if ok else None


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    ops = data["ops"]
    fig, axes = plt.subplots(1, len(ops), figsize=(7 * len(ops), 5.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        res = op["results"]
        ts = [r["T"] for r in res]
        series = {
            "fp4moe sm90 (best config)": [best(r["configs"], "sm90") for r in res],
            "fp4moe Generic (mma.sync)": [best(r["configs"], "generic") for r in res],
            "dequant + cuBLAS (best mode)": [best(r["configs"], "cublas") for r in res],
        }
        for (label, vals), style in zip(series.items(), ["o-", "s--", "^-"]):
            pts = [(t, v["us"]) for t, v in zip(ts, vals) if v]
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        torch_pts = [(r["T"], r["torch"]["us"]) for r in res if r.get("torch")]
        if torch_pts:
            ax.plot(*zip(*torch_pts), "d-", label="torch._grouped_mm BF16")
        ax.plot(ts, [r["byte_floor_us"] for r in res], "k:", label="byte floor (copy BW)")
        ax.plot(ts, [r["compute_floor_us"] for r in res], "k-.", label="compute floor (BF16 peak)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens T (top-8 of E=256)")
        ax.set_ylabel("time (µs, cold L2, median)")
        ax.set_title(f"{op['op']}: N={op['n']} K={op['k']} NVFP4, epilogue {op['epilogue']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    c = data.get("ceilings", {})
    fig.suptitle(f"{data.get('gpu', '')}  {data.get('date', '')}  commit {data.get('commit', '')[:10]}  "
                 f"copy {c.get('copy_gbps', 0):.0f} GB/s, BF16 {c.get('bf16_tflops', 0):.0f} TFLOP/s", fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    print(f"wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
