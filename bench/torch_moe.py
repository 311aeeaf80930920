#!/usr/bin/env python3
"""PyTorch BF16 reference MoE layer at GLM-5 dimensions, on the same GPU as `fp4moe bench moe`.

Two versions of the same layer (router -> permute -> gate_up -> SiLU*up -> down -> weighted
combine + shared expert), BF16 weights (19 GB for 256 experts), FP32 router:
  loop:        a Python loop over the experts that received tokens (torch.matmul each)
  grouped_mm:  torch._grouped_mm over the expert-sorted rows (offsets API)

Routing counts: with --counts-json (the JSON of `fp4moe bench moe`) each T uses exactly the
per-expert token counts our layer saw (the router is still computed and timed, its choice
is replaced by ids built from those counts); without it, top-8 of sigmoid(random logits).
Median of --iters CUDA-event timings after warm-up. Prints a table (with our times and the
ratio when --counts-json is given) and writes --json.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="1,8,32,128,512,2048,8192")
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--hidden", type=int, default=6144)
    p.add_argument("--inter", type=int, default=2048)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--shared-inter", type=int, default=2048)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--counts-json", default="")
    p.add_argument("--json", default="")
    return p.parse_args()


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def ids_from_counts(counts, T, k, gen):
    """[T, k] expert ids whose per-expert totals equal counts (sum = T*k)."""
    flat = torch.repeat_interleave(torch.arange(len(counts), device="cuda"), torch.tensor(counts, device="cuda"))
    assert flat.numel() == T * k, (flat.numel(), T, k)
    perm = torch.randperm(T * k, device="cuda", generator=gen)
    return flat[perm].view(T, k).to(torch.int64)


def main():
    a = parse()
    torch.manual_seed(0)
    dev = "cuda"
    E, H, I, k, SI = a.experts, a.hidden, a.inter, a.top_k, a.shared_inter
    ours = {}
    if a.counts_json:
        with open(a.counts_json) as f:
            j = json.load(f)
        ours = {r["tokens"]: r for r in j["rows"]}
        tokens = sorted(ours)
    else:
        tokens = [int(t) for t in a.tokens.split(",")]
    # Weights (BF16, ~1/sqrt(K) scale), router FP32 + correction bias.
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * (H ** -0.5)
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * (I ** -0.5)
    sw13 = torch.randn(2 * SI, H, device=dev, dtype=torch.bfloat16) * (H ** -0.5)
    sw2 = torch.randn(H, SI, device=dev, dtype=torch.bfloat16) * (SI ** -0.5)
    wg = torch.randn(E, H, device=dev, dtype=torch.float32) * (H ** -0.5)
    bias = torch.randn(E, device=dev, dtype=torch.float32) * 0.05
    w13_t, w2_t = w13.transpose(-2, -1), w2.transpose(-2, -1)  # [E, H, 2I], [E, I, H]
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)

    def route(x, forced_ids):
        logits = x.float() @ wg.t()
        scores = torch.sigmoid(logits)
        sel_ids = torch.topk(scores + bias, k, dim=-1).indices
        ids = forced_ids if forced_ids is not None else sel_ids
        w = scores.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * 2.5
        return ids, w

    def shared(x):
        gu = x @ sw13.t()
        return (F.silu(gu[:, :SI]) * gu[:, SI:]) @ sw2.t()

    def layer_loop(x, forced):
        ids, w = route(x, forced)
        out = shared(x).float()
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()  # host sync, as a loop must
        tok = order // k
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            rows = tok[start:start + c]
            xe = x[rows]
            gu = xe @ w13[e].t()
            he = F.silu(gu[:, :I]) * gu[:, I:]
            ye = (he @ w2[e].t()).float() * w.view(-1)[order[start:start + c]].unsqueeze(1)
            out.index_add_(0, rows, ye)
            start += c
        return out

    def layer_grouped(x, forced):
        ids, w = route(x, forced)
        out = shared(x).float()
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
        tok = order // k
        xp = x[tok]
        gu = torch._grouped_mm(xp, w13_t, offs=offs)
        h = F.silu(gu[:, :I]) * gu[:, I:]
        y = torch._grouped_mm(h, w2_t, offs=offs).float() * w.view(-1)[order].unsqueeze(1)
        out.index_add_(0, tok, y)
        return out

    rows = []
    print("| T | torch loop ms | torch grouped_mm ms | fp4moe eager ms | fp4moe graph ms | vs loop | vs grouped_mm |")
    print("|---|---|---|---|---|---|---|")
    for T in tokens:
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
        forced = ids_from_counts(ours[T]["expert_counts"], T, k, gen) if T in ours else None
        # Check the two versions agree before timing them.
        ref, got = layer_loop(x, forced), layer_grouped(x, forced)
        rel = float((got - ref).norm() / ref.norm())
        iters = a.iters if T < 2048 else max(3, a.iters // 4)
        t_loop = time_ms(lambda: layer_loop(x, forced), iters)
        t_grp = time_ms(lambda: layer_grouped(x, forced), iters)
        r = {"tokens": T, "loop_ms": t_loop, "grouped_mm_ms": t_grp, "loop_vs_grouped_rel_err": rel}
        o = ours.get(T)
        eager = o["eager_ms"] if o else None
        graph = o.get("graph_ms") if o else None
        best = min(v for v in (eager, graph) if v) if o else None
        if o:
            r.update({"fp4moe_eager_ms": eager, "fp4moe_graph_ms": graph,
                      "speedup_vs_loop": t_loop / best, "speedup_vs_grouped_mm": t_grp / best})
        rows.append(r)
        fmt = lambda v: f"{v:.4f}" if v else "-"
        print(f"| {T} | {t_loop:.4f} | {t_grp:.4f} | {fmt(eager)} | {fmt(graph)} | "
              f"{(t_loop / best) if best else float('nan'):.2f}x | {(t_grp / best) if best else float('nan'):.2f}x |")
        if rel > 2e-2:
            print(f"WARNING: loop vs grouped_mm rel err {rel:.3e} at T={T}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "torch_moe", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "experts": E, "hidden": H, "inter": I, "top_k": k, "shared_inter": SI, "rows": rows}, f, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
