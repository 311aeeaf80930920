#!/usr/bin/env python3
"""Tables, plots and the plain-words section of issue 17's serve sweep, from its summary.json.

    bench/serve_sweep_report.py OUT/serve_sweep/summary.json [MORE/summary.json ...] [--out-dir DIR]
                                [--no-plots] [--moe-table FILE.json]

Several summaries (one sweep split over device calls: the same model and workload) are merged
into one: a cell measured in a later call replaces one that an earlier call skipped; a cell
measured twice keeps its first measurement, and the report lists the repeat beside it.
PATH:SERVER[,SERVER] takes only those servers' cells from that summary (e.g. `old.json:fp4moe`
when a later call re-measured a changed baseline). Each baseline cell keeps the server
arguments of its own call (e.g. its --kv-cache), which the side-by-side tables print.

Writes DIR/serve_sweep.md (printed too) and, with matplotlib, DIR/serve_sweep_heatmap.png
(output tok/s over cap x K) and DIR/serve_sweep_tokens_per_expert.png (output tok/s against the
mean tokens per expert per MoE GEMM). Three kinds of numbers, kept apart in the text:
  - measured (bench serve on the wire; the server's /metrics counters during the cell);
  - estimated: the MoE share of each cell's time, from the cell's model steps by size (the
    step-tokens histogram) and a MoE layer time per step size measured by `fp4moe bench moe`
    (bench/RESULTS.md, e8dcecc; --moe-table FILE replaces it: {"tokens": [...], "ms": [...]});
  - extrapolated: the whole model (78 layers, 8 GPUs), from those per-layer times, with the
    arithmetic shown.
"""
import argparse
import json
import math
import os
import sys

# `fp4moe bench moe`, GLM-5 dims (H 6144, I 2048, E 256, top-8, shared expert), tuned plan, cold
# L2, eager ms per MoE layer forward, NVIDIA H200, commit e8dcecc (bench/RESULTS.md).
MOE_TABLE = {"source": "fp4moe bench moe, H200, e8dcecc (bench/RESULTS.md), eager ms, cold L2",
             "tokens": [1, 8, 32, 128, 512, 2048, 8192],
             "ms": [0.1058, 0.4214, 1.0041, 1.8103, 2.9918, 5.3560, 13.5884]}

# Measured on the same H200 (bench/RESULTS.md): copy bandwidth and dense BF16 MMA peak.
H200_COPY_GBS = 4196.0
H200_BF16_TFLOPS = 791.0
H200_MEM_GB = 141.0

# GLM-5 (zai-org/GLM-5 config.json) and the deployment the extrapolation assumes.
GLM5 = dict(layers=78, dense_layers=3, hidden=6144, moe_inter=2048, dense_inter=12288, experts=256, top_k=8,
            vocab=154880, q_lora=2048, kv_lora=512, rope=64, heads=64, nope=192, v_dim=256, index_heads=32,
            index_dim=128)
GPUS = 8
MEM_FRACTION = 0.88
SEED_IN, SEED_OUT = 1024, 1024


def interp_loglog(xs, ys, x):
    """Piecewise log-log interpolation; linear in x beyond the last point (compute-bound), flat
    below the first."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            f = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
            return math.exp(math.log(ys[i - 1]) + f * (math.log(ys[i]) - math.log(ys[i - 1])))
    return ys[-1]


def bucket_tokens(hist):
    """[(representative tokens, steps)] from {upper bound: steps}: the geometric middle of each
    bucket (bounds 1, 2, 4, ...; the open last bucket: twice the last bound)."""
    bounds = sorted((float(k), v) for k, v in hist.items())
    out, lo = [], 0.0
    for ub, n in bounds:
        if n <= 0:
            lo = ub
            continue
        if math.isinf(ub):
            t = 2 * lo
        elif lo <= 0:
            t = ub
        else:
            t = math.sqrt(lo * ub)
        out.append((max(t, 1.0), n))
        lo = ub
    return out


def glm5_numbers():
    g = GLM5
    expert_b = 3 * g["hidden"] * g["moe_inter"] * (0.5 + 1 / 16)  # FP4 values + E4M3 scale per 16
    moe_layer_b = g["experts"] * expert_b
    attn_params = (g["hidden"] * g["q_lora"] + g["q_lora"] * g["heads"] * (g["nope"] + g["rope"])
                   + g["hidden"] * (g["kv_lora"] + g["rope"]) + g["kv_lora"] * g["heads"] * (g["nope"] + g["v_dim"])
                   + g["heads"] * g["v_dim"] * g["hidden"] + g["q_lora"] * g["index_heads"] * g["index_dim"]
                   + g["hidden"] * g["index_dim"] + g["hidden"] * g["index_heads"])
    attn_b = 2 * attn_params
    shared_b = 2 * 3 * g["hidden"] * g["moe_inter"] + 4 * g["experts"] * g["hidden"]  # BF16 shared expert + router
    dense_b = 2 * 3 * g["hidden"] * g["dense_inter"]
    embed_b = 2 * 2 * g["vocab"] * g["hidden"]
    moe_layers = g["layers"] - g["dense_layers"]
    # EP8 + data-parallel attention: experts split over the GPUs, everything else on each.
    per_gpu_b = (moe_layers * moe_layer_b / GPUS + g["layers"] * attn_b + moe_layers * shared_b
                 + g["dense_layers"] * dense_b + embed_b)
    kv_token_layer_b = 2 * (g["kv_lora"] + g["rope"]) + g["index_dim"] + 4  # BF16 latent + FP8 indexer key + scale
    kv_free_b = MEM_FRACTION * H200_MEM_GB * 1e9 - per_gpu_b
    per_req_b = (SEED_IN + SEED_OUT) * g["layers"] * kv_token_layer_b
    flop_token = 2 * g["top_k"] * 3 * g["hidden"] * g["moe_inter"]
    crossover_t = (moe_layer_b / (H200_COPY_GBS * 1e9)) / (flop_token / (H200_BF16_TFLOPS * 1e12))
    return dict(expert_b=expert_b, moe_layer_b=moe_layer_b, attn_b=attn_b, shared_b=shared_b, dense_b=dense_b,
                embed_b=embed_b, per_gpu_b=per_gpu_b, kv_token_layer_b=kv_token_layer_b, kv_free_b=kv_free_b,
                per_req_b=per_req_b, max_req_per_gpu=max(0, int(kv_free_b // per_req_b)), flop_token=flop_token,
                crossover_t=crossover_t, crossover_tpe=crossover_t * g["top_k"] / g["experts"], moe_layers=moe_layers)


def is_glm5(model):
    return model.get("experts") == GLM5["experts"] and model.get("hidden") == GLM5["hidden"]


def lm_head_ms(rows, model):
    """lm_head (BF16, vocab x hidden) for `rows` logit rows (one per request in a step): the larger
    of reading its weights and its FLOPs, at the measured H200 ceilings. An estimate."""
    v, h = model.get("vocab") or GLM5["vocab"], model.get("hidden") or GLM5["hidden"]
    return 1e3 * max(2 * v * h / (H200_COPY_GBS * 1e9), 2 * rows * h * v / (H200_BF16_TFLOPS * 1e12))


def fmt(v, spec=".0f", none="–"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, spec)


def merge_summaries(summaries):
    """One summary from several runs of the same sweep (same model and workload)."""
    first = summaries[0]
    out = dict(first, servers=list(first.get("servers", [])), cells=[], repeats=[],
               runs=[{"started_utc": x.get("started_utc", ""), "env": x.get("env", "")} for x in summaries])
    key_w = lambda x: (x["workload"]["input_len"], x["workload"]["output_len"])  # noqa: E731
    for x in summaries[1:]:
        if x["model"] != first["model"] or key_w(x) != key_w(first):
            raise ValueError(f"summaries of different sweeps: model {x['model']} / {first['model']}, "
                             f"workload {key_w(x)} / {key_w(first)}")
        out["servers"] += x.get("servers", [])
    fp_caps, fp_steps, t_caps, t_steps, any_torch = [], [], [], [], False
    for x in summaries:
        fp_caps += [c for c in x["fp4moe"]["caps"] if c not in fp_caps]
        fp_steps += [k for k in x["fp4moe"]["steps"] if k not in fp_steps]
        if x.get("torch"):
            any_torch = True
            t_caps += [c for c in x["torch"]["caps"] if c not in t_caps]
            t_steps += [k for k in x["torch"]["steps"] if k not in t_steps]
    out["fp4moe"] = dict(first["fp4moe"], caps=sorted(fp_caps), steps=fp_steps)
    if any_torch:
        base = first.get("torch") or next(x["torch"] for x in summaries if x.get("torch"))
        out["torch"] = dict(base, caps=sorted(t_caps), steps=sorted(t_steps))
    where = {}
    for x in summaries:
        for c in x["cells"]:
            k = (c["server"], c["steps"], c["cap"])
            if k not in where:
                where[k] = len(out["cells"])
                out["cells"].append(c)
            elif out_tps(c) and not out_tps(out["cells"][where[k]]):
                out["cells"][where[k]] = c
            elif out_tps(c):
                out["repeats"].append(c)
    return out


def cell_index(cells):
    return {(c["server"], c["steps"], c["cap"]): c for c in cells}


def out_tps(c):
    return c["bench"]["output_throughput"] if c and c.get("status") == "ok" else None


def step_ms(c):
    """A measured cell's wall time per model step (duration / the server's step count)."""
    return 1000 * c["bench"]["duration"] / c["metrics"]["steps"]


def estimate(c, model, table, host_ms=0.0):
    """Per-cell estimates from the step histogram and the MoE layer table; None without them.
    host_ms: the host's work per model step (host_round_estimate's r / K), kept out of the
    per-layer rest and counted once per whole-model step."""
    m = c.get("metrics") or {}
    hist, steps = m.get("step_tokens_hist"), m.get("steps")
    if c.get("status") != "ok" or not hist or not steps:
        return None
    dur_ms = 1000 * c["bench"]["duration"]
    L, M = model["layers"], model["moe_layers"]
    buckets = bucket_tokens(hist)
    moe_ms = sum(n * M * interp_loglog(table["tokens"], table["ms"], t) for t, n in buckets)
    head = lm_head_ms(m.get("mean_step_requests") or c["cap"], model)
    rest_layer_ms = (dur_ms - moe_ms - steps * (head + host_ms)) / (steps * L)
    g, n = GLM5, glm5_numbers()
    # Whole model: each of the 8 GPUs runs this cell's requests (attention, dense parts, per
    # layer as measured here); the experts of a layer see all 8 GPUs' tokens (8 x this cell's
    # step tokens), split over the 8 GPUs.
    moe8_ms = sum(s * interp_loglog(table["tokens"], table["ms"], GPUS * t) / GPUS for t, s in buckets) / steps
    step78_ms = g["layers"] * rest_layer_ms + n["moe_layers"] * moe8_ms + head + host_ms
    out = c["bench"]["total_output_tokens"]
    return dict(step_ms=step_ms(c), moe_share=moe_ms / dur_ms, head_ms=head, rest_layer_ms=rest_layer_ms,
                moe8_ms=moe8_ms, host_ms=host_ms,
                step78_ms=step78_ms, out_per_step=out / steps,
                tps8=GPUS * out / steps / (step78_ms / 1000) if step78_ms > 0 else None,
                requests8=GPUS * c["cap"], fits=c["cap"] <= n["max_req_per_gpu"])


def host_round_estimate(idx, cap, steps):
    """Per-round host work at a cap, from the same cap at the smallest and largest K: a round costs
    K device steps + r of host work that K does not repeat, so ms/step = g + r / K and
    r = (t(K_lo) - t(K_hi)) / (1/K_lo - 1/K_hi). None without both cells or when t does not fall."""
    lo, hi = min(steps), max(steps)
    a, b = idx.get(("fp4moe", lo, cap)), idx.get(("fp4moe", hi, cap))
    if lo == hi or not (out_tps(a) and out_tps(b)):
        return None
    r = (step_ms(a) - step_ms(b)) / (1 / lo - 1 / hi)
    if r <= 0:
        return None
    running = a.get("max_running") or cap
    return {"round_ms": r, "per_request_us": 1000 * r / running,
            "share": {k: r / k / step_ms(idx[("fp4moe", k, cap)])
                      for k in steps if out_tps(idx.get(("fp4moe", k, cap)))}}


def reduction(w):
    """What differs from the seed's workload (1K in / 1K out, enough prompts to saturate)."""
    lens = (w["input_len"], w["output_len"])
    note = ("" if lens == (SEED_IN, SEED_OUT) else
            f"**Reduced**: {lens[0]} in / {lens[1]} out instead of the seed's {SEED_IN} / {SEED_OUT}. ")
    return note + ("Prompts: as few as fill the cap, to fit the device budget (request rate inf: each cell starts "
                   "with its whole running set, then drains).")


def tables(s, table):
    cells, idx = s["cells"], cell_index(s["cells"])
    model = s["model"]
    caps = s["fp4moe"]["caps"]
    steps = sorted(s["fp4moe"]["steps"])
    torch_steps = sorted((s.get("torch") or {}).get("steps", []))
    lines = []
    w = s["workload"]
    lines += [f"Model: {model['layers']} layers ({model['dense_layers']} dense + {model['moe_layers']} MoE), "
              f"{model['experts']} experts top-{model['top_k']}, hidden {model['hidden']}, vocab {model['vocab']}. "
              f"Workload: random ids, {w['input_len']} in / {w['output_len']} out (ignore_eos), prompts per cell "
              f"{w['prompts']}, request rate {w['request_rate']}, max concurrency = the cap. " + reduction(w),
              f"fp4moe: `--backend {s['fp4moe']['backend']}` {s['fp4moe']['serve_args']}; one server per K started "
              f"with cap {s['fp4moe']['server_cap']}, the cell's cap applied by {s['fp4moe']['cap_applied_by']}. "
              f"Environment: {s.get('env', '')}. Tokenizer: {s.get('tokenizer', '')}.", ""]
    for srv in s.get("servers", []):
        lines.append(f"- server {srv['server']} K={srv['steps']}: "
                     + (f"healthy after {srv['start_s']} s" if "start_s" in srv else f"**did not start**: {srv.get('error')}")
                     + (f"; `{srv['startup_lines'][0][:300]}`" if srv.get("startup_lines") else ""))
    lines.append("")
    lines.append("### fp4moe serve: every cell (measured)")
    lines.append("")
    lines.append("| K | cap | prompts | status | output tok/s | total tok/s | TTFT mean / median / p99 ms | "
                 "TPOT mean / median / p99 ms | failed | max running | tokens / expert | tokens / active expert | "
                 "mean step tokens | ms / step | MoE share (est.) | torch tok/s (its K) | × torch |")
    lines.append("|" + "---|" * 17)
    for k in steps:
        for cap in caps:
            c = idx.get(("fp4moe", k, cap))
            if not c:
                continue
            # The baseline at the same K where it ran there, else at its lowest K at this cap.
            tk = next((j for j in [k] + torch_steps if idx.get(("torch", j, cap))), None)
            t = idx.get(("torch", tk, cap)) if tk else None
            tt = out_tps(t)
            tcell = f"{fmt(tt)} (K={tk})" if tt else "–"
            if c["status"] != "ok":
                lines.append(f"| {k} | {cap} | {c.get('num_prompts', '–')} | {c['status']}: {c.get('reason', '')} |"
                             + " |" * 11 + f" {tcell} | – |")
                continue
            b, m, e = c["bench"], c.get("metrics", {}), estimate(c, model, table)
            lines.append(
                f"| {k} | {cap} | {c['num_prompts']} | ok | {b['output_throughput']:.0f} | {b['total_throughput']:.0f} | "
                f"{b['mean_ttft_ms']:.0f} / {b['median_ttft_ms']:.0f} / {b['p99_ttft_ms']:.0f} | "
                f"{b['mean_tpot_ms']:.2f} / {b['median_tpot_ms']:.2f} / {b['p99_tpot_ms']:.2f} | {b['failed']} | "
                f"{c.get('max_running', '–')} | {fmt(m.get('tokens_per_expert_mean'), '.2f')} | "
                f"{fmt(m.get('tokens_per_active_expert_mean'), '.2f')} | {fmt(m.get('mean_step_tokens'), '.0f')} | "
                f"{fmt(e and e['step_ms'], '.2f')} | {fmt(e and 100 * e['moe_share'], '.0f')} % | {tcell} | "
                f"{fmt(b['output_throughput'] / tt if tt else None, '.2f')}× |")
    lines.append("")
    for torch_k in (s["torch"]["steps"] if s.get("torch") else []):
        lines.append(f"### Side by side at K = {torch_k} (the same client, prompts and model; × = fp4moe / torch: "
                     "above 1 is better for tok/s, below 1 for TTFT and TPOT)")
        lines.append("")
        lines.append("| cap | fp4moe output tok/s | torch output tok/s | × | fp4moe TTFT median ms | torch | × | "
                     "fp4moe TPOT median ms | torch | × | fp4moe tokens / expert | torch tokens / expert | "
                     "fp4moe best K | its tok/s | × torch |")
        lines.append("|" + "---|" * 15)
        args = {}
        for cap in s["torch"]["caps"]:
            t, c = idx.get(("torch", torch_k, cap)), idx.get(("fp4moe", torch_k, cap))
            if not t:
                continue
            best = max((idx.get(("fp4moe", k, cap)) for k in steps), key=lambda x: out_tps(x) or -1, default=None)
            tt, ct, bt = out_tps(t), out_tps(c), out_tps(best)
            tb, cb = (t or {}).get("bench") if tt else None, (c or {}).get("bench") if ct else None
            r = lambda a, b: fmt(a / b if a and b else None, ".2f")  # noqa: E731
            tstat = "" if tt else f" ({(t or {}).get('status', 'not run')}: {(t or {}).get('reason', '')})"
            args.setdefault(t.get("server_args") or "(defaults)", []).append(str(cap))
            lines.append(
                f"| {cap} | {fmt(ct)} | {fmt(tt)}{tstat} | {r(ct, tt)} | {fmt(cb and cb['median_ttft_ms'])} | "
                f"{fmt(tb and tb['median_ttft_ms'])} | {r(cb and cb['median_ttft_ms'], tb and tb['median_ttft_ms'])} | "
                f"{fmt(cb and cb['median_tpot_ms'], '.2f')} | {fmt(tb and tb['median_tpot_ms'], '.2f')} | "
                f"{r(cb and cb['median_tpot_ms'], tb and tb['median_tpot_ms'])} | "
                f"{fmt(c and c.get('metrics', {}).get('tokens_per_expert_mean'), '.2f')} | "
                f"{fmt(t and t.get('metrics', {}).get('tokens_per_expert_mean'), '.2f')} | "
                f"{best['steps'] if bt else '–'} | {fmt(bt)} | {r(bt, tt)} |")
        lines.append("")
        if len(args) > 1 or "(defaults)" not in args:
            lines.append("Baseline server arguments: " + "; ".join(f"caps {', '.join(c)}: `{a}`" for a, c in args.items()) + ".")
            lines.append("")
    if s.get("repeats"):
        lines.append("Measured twice (the tables keep the first): " + "; ".join(
            f"{c['server']} K={c['steps']} cap {c['cap']}: {out_tps(idx[(c['server'], c['steps'], c['cap'])]):.0f} "
            f"then {out_tps(c):.0f} output tok/s" for c in s["repeats"]) + ".")
        lines.append("")
    off = [c for c in cells if abs(((c.get("metrics") or {}).get("per_expert_vs_steps") or 1.0) - 1.0) > 0.01]
    if off:
        lines.append("**Check failed**: the per-expert counts the backend reported disagree with the scheduler's step "
                     "sizes (routed tokens / (step tokens × top_k), should be 1): "
                     + ", ".join(f"{c['server']} K={c['steps']} cap {c['cap']}: {c['metrics']['per_expert_vs_steps']:.3f}"
                                 for c in off))
        lines.append("")
    src = {(c.get("metrics") or {}).get("tokens_per_expert_source") for c in cells if c["server"] == "fp4moe" and out_tps(c)}
    if src:
        lines.append("Tokens per expert (fp4moe) from: " + "; ".join(sorted(x for x in src if x)) + ".")
        lines.append("")
    fake = [c for c in cells if c["server"] == "fake"]
    for c in fake:
        lines.append(f"HTTP + scheduler ceiling (`serve --backend fake`, no model time, cap {c['cap']}, same client and "
                     f"prompts): " + (f"**{out_tps(c):.0f} output tok/s**, TPOT median {c['bench']['median_tpot_ms']:.2f} ms; "
                                      f"the best fp4moe cell at this cap reaches "
                                      f"{fmt(max((out_tps(idx.get(('fp4moe', k, c['cap']))) or 0 for k in steps)) / out_tps(c) * 100)} % of it."
                                      if out_tps(c) else f"{c['status']} ({c.get('reason', '')})"))
        lines.append("")
    skipped = [c for c in cells if c["status"] != "ok"]
    if skipped:
        lines.append(f"Cells not measured ({len(skipped)}): "
                     + "; ".join(f"{c['server']} K={c['steps']} cap {c['cap']}: {c['status']} ({c.get('reason', '')})"
                                 for c in skipped))
        lines.append("")
    return lines


def heat_matrix(s):
    idx = cell_index(s["cells"])
    caps, steps = s["fp4moe"]["caps"], sorted(s["fp4moe"]["steps"])
    return caps, steps, [[out_tps(idx.get(("fp4moe", k, cap))) for cap in caps] for k in steps]


def plots(s, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps, steps, z = heat_matrix(s)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 + 1.3 * len(caps)), max(3.5, 1.2 + 0.8 * len(steps))))
    vals = [[v if v is not None else float("nan") for v in row] for row in z]
    im = ax.imshow(vals, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(caps)), [str(c) for c in caps])
    ax.set_yticks(range(len(steps)), [str(k) for k in steps])
    ax.set_xlabel("--max-running-requests (cap)")
    ax.set_ylabel("--num-continuous-decode-steps (K)")
    measured = [x for r in z for x in r if x is not None]
    lo, hi = (min(measured), max(measured)) if measured else (0.0, 1.0)
    for i, row in enumerate(z):
        for j, v in enumerate(row):
            dark = v is not None and (v - lo) < 0.5 * (hi - lo)  # viridis is dark at the low end
            ax.text(j, i, "skipped" if v is None else f"{v:.0f}", ha="center", va="center",
                    color="grey" if v is None else ("white" if dark else "black"), fontsize=9)
    fig.colorbar(im, ax=ax, label="output tok/s")
    m = s["model"]
    ax.set_title(f"fp4moe serve, output tok/s ({m['layers']} layers, {m['moe_layers']} MoE, "
                 f"{s['workload']['input_len']} in / {s['workload']['output_len']} out)", fontsize=10)
    fig.tight_layout()
    heat = os.path.join(out_dir, "serve_sweep_heatmap.png")
    fig.savefig(heat, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [("fp4moe", k) for k in sorted(s["fp4moe"]["steps"])] + \
             ([("torch", k) for k in s["torch"]["steps"]] if s.get("torch") else [])
    for srv, k in series:
        pts = sorted((c["metrics"]["tokens_per_expert_mean"], out_tps(c), c["cap"]) for c in s["cells"]
                     if c["server"] == srv and c["steps"] == k and out_tps(c)
                     and (c.get("metrics") or {}).get("tokens_per_expert_mean"))
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if srv == "fp4moe" else "s--",
                label=f"{srv} K={k}")
        for x, y, cap in pts:
            ax.annotate(str(cap), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    if is_glm5(s["model"]):
        n = glm5_numbers()
        ax.axvline(n["crossover_tpe"], color="grey", lw=0.8, ls=":")
        ax.text(n["crossover_tpe"], ax.get_ylim()[1] * 0.97, " MoE GEMM: bandwidth | compute (est.)", fontsize=7,
                va="top", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("mean tokens per expert per MoE GEMM (labels: cap)")
    ax.set_ylabel("output tok/s")
    ax.set_title("output tok/s against tokens per expert", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tpe = os.path.join(out_dir, "serve_sweep_tokens_per_expert.png")
    fig.savefig(tpe, dpi=120)
    plt.close(fig)
    return [heat, tpe]


def plain_words(s, table):
    """The explanation, with this run's numbers filled in."""
    idx = cell_index(s["cells"])
    caps, steps = s["fp4moe"]["caps"], sorted(s["fp4moe"]["steps"])
    model, n = s["model"], glm5_numbers()
    ok = [c for c in s["cells"] if c["server"] == "fp4moe" and out_tps(c)]
    lines = ["### Where the throughput comes from, and where it stops growing (plain words; this run's numbers)", ""]
    if not ok:
        return lines + ["No fp4moe cell was measured: nothing to explain.", ""]
    best = max(ok, key=out_tps)
    k1 = [(cap, idx.get(("fp4moe", steps[0], cap))) for cap in caps]
    k1 = [(cap, c) for cap, c in k1 if out_tps(c)]
    lo = k1[0] if k1 else None
    lines.append(
        f"- **Batching is the lever.** A decode step reads every weight it touches once, whatever the batch: at cap "
        f"{lo[0] if lo else '–'} (K={steps[0]}) the server makes {fmt(out_tps(lo[1]) if lo else None)} output tok/s "
        f"with {fmt(lo[1]['metrics'].get('tokens_per_expert_mean') if lo else None, '.2f')} tokens per expert per MoE "
        f"GEMM; the best cell, cap {best['cap']} K={best['steps']}, makes {out_tps(best):.0f} tok/s "
        f"({out_tps(best) / out_tps(lo[1]):.1f}×) with {fmt(best['metrics'].get('tokens_per_expert_mean'), '.1f')} "
        f"tokens per expert." if lo else f"- Best cell: cap {best['cap']} K={best['steps']}, {out_tps(best):.0f} tok/s.")
    # Where growth stops: the first cap whose gain over the previous one is under 15 %.
    stall = None
    for (c0, a), (c1, b) in zip(k1, k1[1:]):
        if out_tps(b) < 1.15 * out_tps(a):
            stall = (c0, c1, a, b)
            break
    if stall:
        c0, c1, a, b = stall
        lines.append(f"- **Growth stops** between cap {c0} and cap {c1} at K={steps[0]}: {out_tps(a):.0f} → "
                     f"{out_tps(b):.0f} tok/s (+{100 * (out_tps(b) / out_tps(a) - 1):.0f} %) while the running set went "
                     f"{a.get('max_running', '–')} → {b.get('max_running', '–')}, KV use at most "
                     f"{100 * b.get('max_kv_usage', 0):.0f} %, and the estimated MoE share of the time "
                     f"{fmt((estimate(a, model, table) or {}).get('moe_share', None) and 100 * estimate(a, model, table)['moe_share'], '.0f')} % → "
                     f"{fmt((estimate(b, model, table) or {}).get('moe_share', None) and 100 * estimate(b, model, table)['moe_share'], '.0f')} %.")
    else:
        lines.append(f"- At K={steps[0]} output tok/s still grows by ≥ 15 % at every cap step measured.")
    per_req = s["workload"]["input_len"] + s["workload"]["output_len"]
    seed_note = (f"; at the seed's 1K + 1K it would be {(SEED_IN + SEED_OUT) / per_req:.0f}× that"
                 if per_req < SEED_IN + SEED_OUT else "")
    lines.append(
        f"- **KV memory**: the largest KV use seen in any fp4moe cell is "
        f"{100 * max(c.get('max_kv_usage', 0) for c in ok):.0f} % of the pool at {s['workload']['input_len']} + "
        f"{s['workload']['output_len']} tokens per request{seed_note}: this {model['layers']}-layer model never "
        f"fills the pool; the whole model's {GLM5['layers']} layers would (see the extrapolation), and there the "
        f"running set stops at the pool, not the cap.")
    lines.append(
        f"- **Attention** grows with running requests × context: the time outside the MoE layers per layer per step "
        f"(estimated) goes from {fmt((estimate(lo[1], model, table) or {}).get('rest_layer_ms'), '.3f') if lo else '–'} ms "
        f"at cap {lo[0] if lo else '–'} to {fmt((estimate(k1[-1][1], model, table) or {}).get('rest_layer_ms'), '.3f') if k1 else '–'} ms "
        f"at cap {k1[-1][0] if k1 else '–'} (K={steps[0]})"
        + ("; at 1K / 1K contexts it would be larger still." if per_req < SEED_IN + SEED_OUT else
           " (it holds the host's per-round work too: see below)."))
    lines.append(
        f"- **The MoE GEMM moves from bandwidth- to compute-bound** at about {n['crossover_t']:.0f} tokens per step = "
        f"{n['crossover_tpe']:.0f} tokens per expert: one MoE layer's weights, {n['moe_layer_b'] / 1e9:.2f} GB "
        f"(256 experts × 3 × 6144 × 2048 × 0.5625 B), take {n['moe_layer_b'] / (H200_COPY_GBS * 1e9) * 1e3:.2f} ms at "
        f"{H200_COPY_GBS:.0f} GB/s, and one token's expert work, {n['flop_token'] / 1e6:.0f} MFLOP "
        f"(2 × 8 × 3 × 6144 × 2048), takes {n['flop_token'] / (H200_BF16_TFLOPS * 1e12) * 1e6:.2f} µs at "
        f"{H200_BF16_TFLOPS:.0f} TFLOP/s: {n['moe_layer_b'] / (H200_COPY_GBS * 1e9) * 1e3:.2f} ms / "
        f"{n['flop_token'] / (H200_BF16_TFLOPS * 1e12) * 1e6:.2f} µs = {n['crossover_t']:.0f} tokens. Below it, more "
        f"tokens per step are nearly free in the MoE; above it, they cost their FLOPs.")
    ks = []
    for cap in caps:
        a, b = idx.get(("fp4moe", steps[0], cap)), idx.get(("fp4moe", steps[-1], cap))
        if out_tps(a) and out_tps(b):
            ks.append(f"cap {cap}: {out_tps(b) / out_tps(a):.2f}×")
    if ks and len(steps) > 1:
        lines.append(f"- **K (decode steps per round)**: K={steps[-1]} over K={steps[0]}: " + ", ".join(ks)
                     + ". A round does the scheduler's host work once (batch, pages, sampling rows, the reply to "
                       "every request) and then K device steps; K divides that work by K. It grows with the running "
                       "set, so K pays most where the set is large.")
    hosts = [(cap, host_round_estimate(idx, cap, steps)) for cap in caps]
    hosts = [(cap, h) for cap, h in hosts if h]
    if hosts:
        lines += ["- **Host work per round (estimated from K)**: with ms/step = g + r / K at one cap, the cells at "
                  f"K={steps[0]} and K={steps[-1]} give r, the round's host work that K does not repeat: "
                  + ", ".join(f"cap {cap}: {h['round_ms']:.2f} ms = {h['per_request_us']:.1f} µs per running request"
                              for cap, h in hosts) + ". Shares of the step time, MoE (from the MoE layer table) / host "
                  "(from r) / the rest (attention, dense MLP, lm_head, sampling, prefill):", "",
                  "| K | cap | ms / step | MoE % (est.) | host % (est.) | rest % | host % (measured: engine busy − backend) |",
                  "|---|---|---|---|---|---|---|"]
        for k in steps:
            for cap, h in hosts:
                c = idx.get(("fp4moe", k, cap))
                e = estimate(c, model, table) if c else None
                if not e or k not in h["share"]:
                    continue
                moe, host = 100 * e["moe_share"], 100 * h["share"][k]
                measured = (c.get("metrics") or {}).get("host_share_measured")
                lines.append(f"| {k} | {cap} | {e['step_ms']:.2f} | {moe:.0f} | {host:.0f} | {100 - moe - host:.0f} | "
                             f"{fmt(measured and 100 * measured, '.0f', 'not counted by this server')} |")
        lines.append("")
    lines.append("- The MoE share is an estimate from the MoE layer times of "
                 f"`{table['source']}` at this cell's step sizes; the host share (est.) assumes the round's host work does "
                 "not overlap the device steps; the measured one is the engine thread's busy time minus its backend "
                 "calls (`fp4moe_engine_busy_seconds_total`, `fp4moe_engine_backend_seconds_total`).")
    lines.append("")
    return lines


def extrapolation(s, table):
    idx = cell_index(s["cells"])
    caps, steps = s["fp4moe"]["caps"], sorted(s["fp4moe"]["steps"])
    model, n, g = s["model"], glm5_numbers(), GLM5
    host = {cap: host_round_estimate(idx, cap, steps) for cap in caps}

    def est(k, cap):
        c = idx.get(("fp4moe", k, cap))
        h = host.get(cap)
        return estimate(c, model, table, h["round_ms"] / k if h else 0.0) if c else None
    lines = ["### Whole model (78 layers, 8 GPUs): an extrapolation, NOT a measurement", ""]
    if not is_glm5(model):
        lines += ["(This model is not at GLM-5 dims: the rows below are arithmetic only.)", ""]
    lines += [
             f"Deployment assumed: SGLang-style data-parallel attention + expert parallelism over {GPUS} H200s. Each GPU "
             f"runs all {g['layers']} layers' attention / dense parts for its own requests (as this cell's GPU did), and "
             f"holds {g['experts'] // GPUS} of each MoE layer's {g['experts']} experts, which see every GPU's tokens "
             f"({GPUS}× this cell's step tokens; so the tokens per expert are {GPUS}× those measured here). "
             "No all-to-all or load-imbalance cost, perfect overlap: an upper bound.", "",
             "Per cell (measured: duration d, model steps s, output tokens o, steps by size from the histogram; "
             "MoE layer time t_moe(T) from the table above; L, M = this model's layers, MoE layers):",
             "- MoE time in the cell (est.) = Σ_steps M × t_moe(T_step);",
             "- lm_head per step h (est.) = max(vocab × hidden × 2 B / copy BW, 2 × R × hidden × vocab / BF16 peak), "
             "R = mean requests per step;",
             "- host per step u (est.) = the round's host work / K (see above; 0 where it was not estimated);",
             "- rest per layer per step r = (d − MoE time − s × (h + u)) / (s × L) (attention, dense MLP, norms, and a "
             "1/L share of embedding and sampling: an over-estimate per layer"
             + ("; measured at this run's short contexts, so an under-estimate of attention at 1K + 1K);"
                if s["workload"]["input_len"] + s["workload"]["output_len"] < SEED_IN + SEED_OUT else ");"),
             f"- whole-model step = {g['layers']} × r + {n['moe_layers']} × mean_steps[t_moe({GPUS} × T_step) / {GPUS}] + h + u;",
             f"- whole-model output tok/s = {GPUS} × o / s / step.",
             f"- KV at the seed's {SEED_IN} + {SEED_OUT} tokens: per GPU {g['layers']} layers × "
             f"{n['kv_token_layer_b']} B per token-layer (BF16 latent 576 × 2 + FP8 indexer key 128 + scale 4) × 2048 = "
             f"{n['per_req_b'] / 1e6:.0f} MB per request; weights per GPU {n['per_gpu_b'] / 1e9:.1f} GB "
             f"({n['moe_layers']} × {n['moe_layer_b'] / 1e9:.2f} GB experts / {GPUS} + replicated attention, shared experts, "
             f"dense MLPs, embeddings); {MEM_FRACTION} × {H200_MEM_GB:.0f} GB − weights = {n['kv_free_b'] / 1e9:.1f} GB "
             f"for KV = **{n['max_req_per_gpu']} requests per GPU, {GPUS * n['max_req_per_gpu']} in all** "
             "(workspaces not counted).", "",
             "| K | cap per GPU | requests in all | measured tok/s (this model) | ms / step measured | lm_head ms (est.) | "
             "host ms / step (est.) | rest per layer ms | whole-model MoE ms / layer-step | whole-model step ms | whole-model tok/s (8 GPUs) | "
             "KV fits at 1K+1K |",
             "|" + "---|" * 12]
    for k in steps:
        for cap in caps:
            c, e = idx.get(("fp4moe", k, cap)), est(k, cap)
            if not e:
                continue
            lines.append(f"| {k} | {cap} | {e['requests8']} | {out_tps(c):.0f} | {e['step_ms']:.2f} | {e['head_ms']:.2f} | "
                         f"{e['host_ms']:.2f} | {e['rest_layer_ms']:.3f} | {e['moe8_ms']:.3f} | {e['step78_ms']:.1f} | "
                         f"{fmt(e['tps8'])} | {'yes' if e['fits'] else 'no'} |")
    ex = [(k, cap, est(k, cap)) for k in steps for cap in caps]
    ex = [(k, cap, e) for k, cap, e in ex if e]
    fitting = [x for x in ex if x[2]["fits"]]
    if ex:
        k, cap, e = max(fitting or ex, key=lambda x: x[2]["tps8"] or 0)
        which = "the largest row whose KV fits at 1K + 1K" if fitting else "the largest row; none fits the KV at 1K + 1K"
        lines += ["", f"Worked example ({which}, K={k}, cap {cap}): {g['layers']} × {e['rest_layer_ms']:.3f} + "
                      f"{n['moe_layers']} × {e['moe8_ms']:.3f} + {e['head_ms']:.2f} + {e['host_ms']:.2f} = {e['step78_ms']:.1f} ms per step; {GPUS} × "
                      f"{e['out_per_step']:.1f} output tokens per step / {e['step78_ms']:.1f} ms = {e['tps8']:.0f} tok/s."]
    lines += ["", "For scale, the seed's system (GLM-5-NVFP4, 8 Blackwell GPUs, SGLang): ~880 output tok/s by default, "
                  "~3,740 with cap 2048 and K = 8 (issue 17)."]
    lines.append("")
    return lines


def report(s, table):
    lines = [f"## Serve sweep (issue 17), {s.get('started_utc', '')}", ""]
    if len(s.get("runs", [])) > 1:
        lines += [f"Merged from {len(s['runs'])} runs of the same sweep (one per device call): "
                  + "; ".join(f"{r['started_utc']} ({r['env']})" for r in s["runs"]) + ".", ""]
    lines += tables(s, table)
    lines += ["MoE layer time used for the estimates (" + table["source"] + "): "
              + ", ".join(f"T={t}: {ms} ms" for t, ms in zip(table["tokens"], table["ms"])), ""]
    lines += plain_words(s, table)
    lines += extrapolation(s, table)
    return "\n".join(lines) + "\n"


def load_summary(arg):
    """(path, summary) from PATH or PATH:SERVER[,SERVER] (only those servers' cells). Each baseline
    cell records its call's server arguments (server_args), which the side-by-side tables print."""
    path, only = arg, None
    if not os.path.exists(arg) and ":" in arg:
        path, names = arg.rsplit(":", 1)
        only = set(names.split(","))
    with open(path) as f:
        x = json.load(f)
    if only is not None:
        x["cells"] = [c for c in x["cells"] if c["server"] in only]
        if "torch" not in only:
            x["torch"] = None
    for c in x["cells"]:
        if c["server"] == "torch" and x.get("torch"):
            c.setdefault("server_args", x["torch"].get("args", ""))
    return path, x


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("summary", nargs="+",
                   help="summary.json of bench/serve_sweep.py (several: merged); PATH:SERVER[,SERVER] keeps only those servers' cells")
    p.add_argument("--out-dir", default="", help="default: the summary's folder")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--moe-table", default="", help='JSON {"tokens": [...], "ms": [...], "source": "..."}')
    a = p.parse_args(argv)
    paths, loaded = [], []
    for arg in a.summary:
        try:
            path, x = load_summary(arg)
        except (OSError, ValueError) as e:
            print(f"serve_sweep_report: {arg}: {e}", file=sys.stderr)
            return 1
        paths.append(path)
        loaded.append(x)
    try:
        s = merge_summaries(loaded) if len(loaded) > 1 else loaded[0]
    except (KeyError, ValueError) as e:
        print(f"serve_sweep_report: {e}", file=sys.stderr)
        return 1
    table = MOE_TABLE
    if a.moe_table:
        with open(a.moe_table) as f:
            table = dict(MOE_TABLE, **json.load(f))
    out_dir = a.out_dir or os.path.dirname(os.path.abspath(paths[0]))
    os.makedirs(out_dir, exist_ok=True)
    md = report(s, table)
    if not a.no_plots:
        try:
            pngs = plots(s, out_dir)
            md += "\n" + "\n".join(f"![{os.path.basename(x)}]({os.path.basename(x)})" for x in pngs) + "\n"
        except ImportError:
            md += "\n(plots skipped: matplotlib is not installed)\n"
    with open(os.path.join(out_dir, "serve_sweep.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
