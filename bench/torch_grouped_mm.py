#!/usr/bin/env python3
"""torch._grouped_mm BF16 baseline for `fp4moe bench gemm` (runs on the GPU machine).

Same shapes (GLM-5 MoE: gate_up N=4096 K=6144, down N=6144 K=2048, E=256, top-8) and the
same routing counts as the C++ benchmark: each token takes the 8 experts with the largest
key(t, e) = mix64(seed * C1 + 1 + (t * E + e) * C2) (splitmix64 finaliser, all mod 2^64),
which is exactly top-8 of i.i.d. random normal logits (a normal logit is a monotone
function of a uniform one). Timing: cold L2 (a 256 MiB buffer is zeroed before every timed
run), CUDA events around each run, median of --iters after warm-up. Random BF16 weights
(not zeros). Reports the GEMM alone ("us") and the GEMM plus the epilogue the fp4moe kernel
fuses ("us_with_epilogue": SiLU(gate)*up for gate_up, row scale for down).

  python3 bench/torch_grouped_mm.py --json out/torch_grouped_mm.json [--tokens 1,8,...]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

MASK = (1 << 64) - 1
C1 = 0x9E3779B97F4A7C15
C2 = 0xD1B54A32D192ED03
E, TOP_K = 256, 8
OPS = {"gate_up": (4096, 6144), "down": (6144, 2048)}


def mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def routing_counts(tokens, experts=E, top_k=TOP_K, seed=0x5EED):
    """Tokens per expert, identical to routing_counts() in src/cli/cmd_bench_gemm.cpp."""
    base = np.uint64((seed * C1 + 1) & MASK)
    counts = np.zeros(experts, dtype=np.int64)
    chunk = 4096
    with np.errstate(over="ignore"):
        for t0 in range(0, tokens, chunk):
            t = np.arange(t0, min(tokens, t0 + chunk), dtype=np.uint64)[:, None]
            idx = t * np.uint64(experts) + np.arange(experts, dtype=np.uint64)[None, :]
            keys = mix64(base + idx * np.uint64(C2))
            top = np.argpartition(keys, experts - top_k, axis=1)[:, experts - top_k:]
            counts += np.bincount(top.ravel(), minlength=experts)
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", default="1,8,32,128,512,2048,8192,16384")
    ap.add_argument("--op", default="both", choices=["gate_up", "down", "both"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0x5EED)
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]

    import torch
    import torch.nn.functional as F

    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    out = {"bench": "torch_grouped_mm", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "seed": args.seed, "iters": args.iters, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "method": "cold L2 (256 MiB zeroed before each timed run), median of CUDA-event times",
           "results": []}

    def time_us(fn):
        for _ in range(3):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
        for i in range(args.iters):
            flush.zero_()
            starts[i].record()
            fn()
            stops[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops)) * 1e3

    ops = ["gate_up", "down"] if args.op == "both" else [args.op]
    max_rows = max(tokens) * TOP_K
    for op in ops:
        n, k = OPS[op]
        g = torch.Generator(device=dev).manual_seed(1234)
        w = torch.randn(E, n, k, device=dev, dtype=torch.bfloat16, generator=g) * (k ** -0.5)  # [E, N, K]
        w_t = w.transpose(1, 2)  # [E, K, N] view (column-major per expert), as _grouped_mm wants
        x_all = torch.randn(max_rows, k, device=dev, dtype=torch.bfloat16, generator=g)
        rs_all = torch.rand(max_rows, device=dev, dtype=torch.float32, generator=g)
        for t in tokens:
            counts = routing_counts(t, seed=args.seed)
            m_total = int(counts.sum())
            offs = torch.tensor(np.cumsum(counts), dtype=torch.int32, device=dev)  # [E] end offsets
            x = x_all[:m_total]
            rs = rs_all[:m_total]
            rec = {"op": op, "T": t, "m_total": m_total, "hit": int((counts > 0).sum()), "n": n, "k": k}
            try:
                gemm = lambda: torch._grouped_mm(x, w_t, offs=offs, out_dtype=torch.bfloat16)
                if op == "gate_up":
                    def fused():
                        y = gemm()
                        return F.silu(y[:, : n // 2]) * y[:, n // 2:]
                else:
                    def fused():
                        return gemm() * rs[:, None].to(torch.bfloat16)
                # Correctness spot check against a plain per-expert matmul (first hit expert).
                y = gemm()
                e0 = int(np.nonzero(counts)[0][0])
                r0, r1 = int(offs[e0].item()) - int(counts[e0]), int(offs[e0].item())
                ref = x[r0:r1].float() @ w[e0].float().t()
                rec["rel_err_first_expert"] = float((y[r0:r1].float() - ref).norm() / ref.norm())
                rec["us"] = time_us(gemm)
                rec["us_with_epilogue"] = time_us(fused)
                flops = 2.0 * m_total * n * k
                rec["tflops"] = flops / (rec["us"] * 1e-6) / 1e12
            except Exception as ex:  # record and go on: a missing kernel must not hide the rest
                rec["error"] = f"{type(ex).__name__}: {ex}"
            out["results"].append(rec)
            print(f"| torch  | {op:7s} | T={t:6d} | hit {rec['hit']:3d} | "
                  + (f"{rec['us']:10.1f} us | +epi {rec['us_with_epilogue']:10.1f} us | {rec['tflops']:6.1f} TFLOP/s |"
                     if "us" in rec else f"failed: {rec['error'][:120]}"), flush=True)
        del w, w_t, x_all, rs_all
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
