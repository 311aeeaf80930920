#!/usr/bin/env python3
"""bench/serve_sweep.py's /metrics arithmetic and bench/serve_sweep_report.py on a made-up summary
(GLM-5 dims, 20 fp4moe cells with one skipped, the baseline at K = 1): the tables have a row per
cell with the right ratios, skipped cells say why, the estimates follow their formulas, and the
PNGs are written (when matplotlib is installed). Python's standard library only otherwise."""
import importlib.util
import json
import math
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

import serve_sweep  # noqa: E402
import serve_sweep_report as rep  # noqa: E402

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
CAPS, STEPS = [16, 64, 256, 1024, 2048], [1, 8, 4, 2]


def fake_cell(server, k, cap, tps):
    steps = 1000
    step_tokens = cap * 1.1  # decode + a little prefill
    # All steps in the bucket whose upper bound is the next power of two above step_tokens.
    ub = 2 ** math.ceil(math.log2(step_tokens))
    out_tokens = 64 * max(64, 2 * cap)
    return {"server": server, "steps": k, "cap": cap, "num_prompts": max(64, 2 * cap), "status": "ok",
            "max_running": cap, "max_kv_usage": cap / 4096,
            "metrics": {"steps": steps, "mean_step_tokens": step_tokens, "mean_step_requests": cap, "tokens_per_expert_mean": step_tokens * 8 / 256,
                        "tokens_per_active_expert_mean": step_tokens * 8 / 256 + 0.5,
                        "step_tokens_hist": dict({str(2 ** i): steps * (2 ** i == ub) for i in range(15)}, **{"+Inf": 0})
                        if server == "fp4moe" else None},
            "bench": {"output_throughput": tps, "total_throughput": 2 * tps, "duration": out_tokens / tps,
                      "total_output_tokens": out_tokens, "failed": 0, "completed": max(64, 2 * cap),
                      "mean_ttft_ms": 100.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 300.0,
                      "mean_tpot_ms": 20.0, "median_tpot_ms": 19.0, "p99_tpot_ms": 40.0}}


def fake_summary():
    cells = []
    for k in STEPS:
        for cap in CAPS:
            if (k, cap) == (2, 2048):
                cells.append({"server": "fp4moe", "steps": k, "cap": cap, "num_prompts": 2048, "status": "skipped",
                              "reason": "budget: 10 s left, ~40 s predicted"})
            else:
                cells.append(fake_cell("fp4moe", k, cap, 100.0 * cap ** 0.5 * (1 + 0.05 * k)))
    for cap in CAPS:
        cells.append(fake_cell("torch", 1, cap, 25.0 * cap ** 0.5))
    cells.append(fake_cell("fake", 1, 2048, 20000.0))
    return {"started_utc": "2026-12-03T17:00:00Z",
            "model": {"layers": 2, "dense_layers": 1, "moe_layers": 1, "experts": 256, "top_k": 8, "hidden": 6144,
                      "vocab": 154880},
            "workload": {"input_len": 64, "output_len": 64, "prompts": "max(64, min(2 x cap, max(cap, 1024)))",
                         "request_rate": "inf", "reduction": "64 in / 64 out instead of the seed's 1024 / 1024"},
            "fp4moe": {"backend": "cuda", "caps": CAPS, "steps": STEPS, "serve_args": "", "server_cap": 2048,
                       "cap_applied_by": "the client's --max-concurrency"},
            "torch": {"caps": CAPS, "steps": [1], "args": "", "server_cap": 2048},
            "servers": [{"server": "fp4moe", "steps": 1, "start_s": 14.2, "startup_lines": ["serving 'x' ..."]}],
            "cells": cells}


class Report(unittest.TestCase):
    def test_interpolation_hits_the_table_and_extends_linearly(self):
        t = rep.MOE_TABLE
        for x, y in zip(t["tokens"], t["ms"]):
            self.assertAlmostEqual(rep.interp_loglog(t["tokens"], t["ms"], x), y)
        self.assertAlmostEqual(rep.interp_loglog(t["tokens"], t["ms"], 2 * 8192), 2 * t["ms"][-1])
        mid = rep.interp_loglog(t["tokens"], t["ms"], 1024)
        self.assertTrue(t["ms"][4] < mid < t["ms"][5])

    def test_buckets_become_geometric_middles(self):
        self.assertEqual(rep.bucket_tokens({"1": 3, "2": 0, "4": 5, "+Inf": 0}), [(1.0, 3), (math.sqrt(8), 5)])
        self.assertEqual(rep.bucket_tokens({"8192": 0, "16384": 0, "+Inf": 2}), [(2 * 16384, 2)])

    def test_glm5_crossover_is_bytes_over_flops(self):
        n = rep.glm5_numbers()
        self.assertAlmostEqual(n["moe_layer_b"], 256 * 3 * 6144 * 2048 * 0.5625)
        bytes_ms = n["moe_layer_b"] / (rep.H200_COPY_GBS * 1e9) * 1e3
        flop_ms = 2 * 8 * 3 * 6144 * 2048 / (rep.H200_BF16_TFLOPS * 1e12) * 1e3
        self.assertAlmostEqual(n["crossover_t"], bytes_ms / flop_ms)
        self.assertAlmostEqual(n["crossover_tpe"], n["crossover_t"] * 8 / 256)

    def test_estimate_follows_its_formula(self):
        s = fake_summary()
        c = fake_cell("fp4moe", 1, 256, 3000.0)
        e = rep.estimate(c, s["model"], rep.MOE_TABLE)
        t = math.sqrt(256 * 512)  # the bucket of 281.6 step tokens: (256, 512]
        moe = 1000 * rep.interp_loglog(rep.MOE_TABLE["tokens"], rep.MOE_TABLE["ms"], t)
        dur_ms = 1000 * c["bench"]["duration"]
        self.assertAlmostEqual(e["moe_share"], moe / dur_ms)
        head = 1e3 * max(2 * 154880 * 6144 / (rep.H200_COPY_GBS * 1e9), 2 * 256 * 6144 * 154880 / (rep.H200_BF16_TFLOPS * 1e12))
        self.assertAlmostEqual(e["head_ms"], head)
        self.assertAlmostEqual(e["rest_layer_ms"], (dur_ms - moe - 1000 * head) / (1000 * 2))
        moe8 = rep.interp_loglog(rep.MOE_TABLE["tokens"], rep.MOE_TABLE["ms"], 8 * t) / 8
        self.assertAlmostEqual(e["step78_ms"], 78 * e["rest_layer_ms"] + 75 * moe8 + head)
        self.assertAlmostEqual(e["tps8"], 8 * c["bench"]["total_output_tokens"] / 1000 / (e["step78_ms"] / 1000))
        self.assertIsNone(rep.estimate(s["cells"][19], s["model"], rep.MOE_TABLE))  # the skipped cell

    def test_report_has_every_cell_the_ratios_and_the_plots(self):
        s = fake_summary()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "summary.json")
            with open(path, "w") as f:
                json.dump(s, f)
            args = [path, "--out-dir", d] + ([] if HAVE_MPL else ["--no-plots"])
            with open(os.devnull, "w") as null:
                old, sys.stdout = sys.stdout, null
                try:
                    self.assertEqual(rep.main(args), 0)
                finally:
                    sys.stdout = old
            with open(os.path.join(d, "serve_sweep.md")) as f:
                md = f.read()
            if HAVE_MPL:
                for png in ("serve_sweep_heatmap.png", "serve_sweep_tokens_per_expert.png"):
                    with open(os.path.join(d, png), "rb") as f:
                        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
                    self.assertIn(f"]({png})", md)
        rows = [line for line in md.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
        every = [r for r in rows if len(r.split("|")) == 19]  # the every-cell table: 17 columns
        self.assertEqual(len(every), 20)
        skipped = [r for r in every if "skipped" in r]
        self.assertEqual(len(skipped), 1)
        self.assertIn("budget: 10 s left", skipped[0])
        # K=1 cap 256: fp4moe 100 x 16 x 1.05 = 1680, torch 25 x 16 = 400: 4.20x.
        row = next(r for r in every if r.startswith("| 1 | 256 |"))
        self.assertIn("| 1680 |", row)
        self.assertIn("| 400 (K=1) | 4.20× |", row)
        # The baseline ran at K=1 only: a K=8 row compares against it and says so.
        self.assertIn("| 400 (K=1) |", next(r for r in every if r.startswith("| 8 | 256 |")))
        side = [r for r in rows if len(r.split("|")) == 17]  # side by side: 15 columns
        self.assertEqual(len(side), 5)
        self.assertTrue(side[2].startswith("| 256 | 1680 | 400 | 4.20 |"), side[2])
        # fp4moe's best at cap 2048: K=8, 100 x sqrt(2048) x 1.4 = 6336 tok/s, 32 % of the fake ceiling.
        self.assertIn("no model time, cap 2048, same client and prompts): **20000 output tok/s**", md)
        self.assertIn("reaches 32 % of it", md)
        self.assertNotIn("Check failed", md)
        self.assertIn("NOT a measurement", md)
        self.assertIn("Worked example", md)
        self.assertIn("64 in / 64 out instead of the seed's 1024 / 1024", md)
        self.assertIn("Growth stops" if "Growth stops" in md else "still grows", md)

    def test_merged_runs_replace_skipped_cells_and_list_repeats(self):
        a, b = fake_summary(), fake_summary()
        b["started_utc"] = "2026-12-03T18:00:00Z"
        b["fp4moe"]["steps"], b["torch"]["steps"] = [2], [8]
        b["cells"] = [fake_cell("fp4moe", 2, 2048, 5000.0), fake_cell("fp4moe", 8, 16, 123.0),
                      fake_cell("torch", 8, 16, 77.0)]
        m = rep.merge_summaries([a, b])
        idx = rep.cell_index(m["cells"])
        self.assertEqual(idx[("fp4moe", 2, 2048)]["status"], "ok")  # skipped in a, measured in b
        self.assertEqual(rep.out_tps(idx[("fp4moe", 8, 16)]), rep.out_tps(rep.cell_index(a["cells"])[("fp4moe", 8, 16)]))
        self.assertEqual([rep.out_tps(c) for c in m["repeats"]], [123.0])
        self.assertEqual(m["torch"]["steps"], [1, 8])
        self.assertEqual(len(m["runs"]), 2)
        md = rep.report(m, rep.MOE_TABLE)
        self.assertIn("Side by side at K = 8", md)
        self.assertIn("then 123 output tok/s", md)
        b["workload"] = dict(b["workload"], output_len=1024)
        with self.assertRaises(ValueError):
            rep.merge_summaries([a, b])

    def test_a_server_filter_drops_that_runs_other_cells_and_keeps_each_baselines_args(self):
        a, b = fake_summary(), fake_summary()
        a["torch"]["args"], b["torch"]["args"] = "--kv-cache latent", "--kv-cache expanded"
        b["cells"] = [fake_cell("torch", 1, 16, 555.0)]
        b["torch"]["caps"] = [16]
        with tempfile.TemporaryDirectory() as d:
            pa, pb = os.path.join(d, "a.json"), os.path.join(d, "b.json")
            for path, x in ((pa, a), (pb, b)):
                with open(path, "w") as f:
                    json.dump(x, f)
            with open(os.devnull, "w") as null:
                old, sys.stdout = sys.stdout, null
                try:
                    self.assertEqual(rep.main([pa + ":fp4moe,fake", pb, "--out-dir", d, "--no-plots"]), 0)
                finally:
                    sys.stdout = old
            with open(os.path.join(d, "serve_sweep.md")) as f:
                md = f.read()
        side = [r for r in md.splitlines() if r.startswith("| ") and len(r.split("|")) == 17 and r[2].isdigit()]
        self.assertEqual(len(side), 1)  # a's baseline cells are gone; b's cap 16 only
        self.assertIn("| 555 |", side[0])
        self.assertIn("caps 16: `--kv-cache expanded`", md)
        self.assertNotIn("then 555", md)  # not a repeat of a's dropped cell

    def test_host_round_work_follows_from_the_smallest_and_largest_k(self):
        s = fake_summary()
        idx = rep.cell_index(s["cells"])
        t = {k: 1000 * idx[("fp4moe", k, 256)]["bench"]["duration"] / idx[("fp4moe", k, 256)]["metrics"]["steps"]
             for k in STEPS}
        h = rep.host_round_estimate(idx, 256, STEPS)
        r = (t[1] - t[8]) / (1 - 1 / 8)
        self.assertAlmostEqual(h["round_ms"], r)
        self.assertAlmostEqual(h["per_request_us"], 1000 * r / 256)
        self.assertAlmostEqual(h["share"][1], r / t[1])
        self.assertAlmostEqual(h["share"][8], r / 8 / t[8])
        self.assertIsNone(rep.host_round_estimate(idx, 256, [1]))

    def test_counts_that_disagree_with_the_steps_are_flagged(self):
        s = fake_summary()
        s["cells"][0]["metrics"]["per_expert_vs_steps"] = 0.5
        md = "\n".join(rep.tables(s, rep.MOE_TABLE))
        self.assertIn("**Check failed**", md)
        self.assertIn("fp4moe K=1 cap 16: 0.500", md)

    def test_a_missing_summary_is_one_line_and_exit_1(self):
        with open(os.devnull, "w") as null:
            old, sys.stderr = sys.stderr, null
            try:
                self.assertEqual(rep.main(["/nonexistent/summary.json", "--no-plots"]), 1)
            finally:
                sys.stderr = old


def prom(gemms, steps, zeros, ones, experts_count, experts_sum, le64, le128, steps_count, steps_sum):
    """fp4moe's /metrics text with the counters the sweep reads (and a gauge it must not)."""
    h, b = "fp4moe_moe_expert_tokens", "fp4moe_step_batch_tokens"
    return "\n".join([
        "# HELP fp4moe_moe_gemms_total x", "# TYPE fp4moe_moe_gemms_total counter",
        f"fp4moe_moe_gemms_total {gemms}", f"fp4moe_engine_steps_total {steps}",
        f'{h}_bucket{{le="0"}} {zeros}', f'{h}_bucket{{le="1"}} {ones}', f'{h}_bucket{{le="+Inf"}} {experts_count}',
        f"{h}_sum {experts_sum}", f"{h}_count {experts_count}",
        f'{b}_bucket{{le="64"}} {le64}', f'{b}_bucket{{le="128"}} {le128}', f'{b}_bucket{{le="+Inf"}} {steps_count}',
        f"{b}_sum {steps_sum}", f"{b}_count {steps_count}", "fp4moe_moe_tokens_per_expert_mean 0.39", ""])


class SweepMetrics(unittest.TestCase):
    BEFORE = prom(10, 5, 100, 200, 2560, 1000, 5, 5, 5, 160)
    AFTER = prom(30, 25, 1100, 1300, 7680, 21480, 5, 20, 25, 2720)

    def test_cell_numbers_are_differences_of_counters(self):
        m0, m1 = serve_sweep.parse_prometheus(self.BEFORE), serve_sweep.parse_prometheus(self.AFTER)
        d = serve_sweep.metric_deltas("fp4moe", m0, m1, 8, 256)
        self.assertEqual(d["moe_gemms"], 20)
        self.assertEqual(d["steps"], 20)
        self.assertAlmostEqual(d["tokens_per_expert_mean"], 20480 / 5120)  # not the since-start gauge
        self.assertAlmostEqual(d["tokens_per_active_expert_mean"], 20480 / (5120 - 1000))
        self.assertAlmostEqual(d["mean_step_tokens"], 2560 / 20)
        self.assertAlmostEqual(d["tokens_per_expert_from_steps"], 2560 * 8 / (20 * 256))
        self.assertEqual(d["step_tokens_hist"], {"64": 0, "128": 15, "+Inf": 5})
        self.assertAlmostEqual(d["per_expert_vs_steps"], (20480 / 5120) / (2560 * 8 / (20 * 256)))

    def test_host_share_is_busy_minus_backend_over_busy(self):
        extra0 = "fp4moe_engine_busy_seconds_total 1.5\nfp4moe_engine_backend_seconds_total 1.0\nfp4moe_engine_rounds_total 10\n"
        extra1 = "fp4moe_engine_busy_seconds_total 5.5\nfp4moe_engine_backend_seconds_total 4.0\nfp4moe_engine_rounds_total 30\n"
        m0 = serve_sweep.parse_prometheus(self.BEFORE + extra0)
        m1 = serve_sweep.parse_prometheus(self.AFTER + extra1)
        d = serve_sweep.metric_deltas("fp4moe", m0, m1, 8, 256)
        self.assertAlmostEqual(d["host_share_measured"], (4.0 - 3.0) / 4.0)
        self.assertAlmostEqual(d["host_us_per_round"], 1e6 * 1.0 / 20)
        old = serve_sweep.metric_deltas("fp4moe", serve_sweep.parse_prometheus(self.BEFORE),
                                        serve_sweep.parse_prometheus(self.AFTER), 8, 256)
        self.assertNotIn("host_share_measured", old)  # a server without the counters

    def test_without_per_expert_counts_the_steps_give_the_mean(self):
        m0 = serve_sweep.parse_prometheus(self.BEFORE.replace("fp4moe_moe_expert", "x_"))
        m1 = serve_sweep.parse_prometheus(self.AFTER.replace("fp4moe_moe_expert", "x_"))
        d = serve_sweep.metric_deltas("fp4moe", m0, m1, 8, 256)
        self.assertAlmostEqual(d["tokens_per_expert_mean"], 2560 * 8 / (20 * 256))
        self.assertIn("step tokens", d["tokens_per_expert_source"])

    def test_baseline_counts_prefill_and_decode_steps(self):
        m0 = {"decode_steps": 10, "decode_tokens": 100, "prefill_steps": 1, "prefill_tokens": 640}
        m1 = {"decode_steps": 30, "decode_tokens": 1380, "prefill_steps": 2, "prefill_tokens": 1280}
        d = serve_sweep.metric_deltas("torch", m0, m1, 8, 256)
        self.assertAlmostEqual(d["mean_step_tokens"], (1280 + 640) / 21)
        self.assertAlmostEqual(d["tokens_per_expert_mean"], (1280 + 640) / 21 * 8 / 256)
        self.assertAlmostEqual(d["mean_decode_batch"], 64)

    def test_prompts_rule_two_waves_then_one_wave(self):
        a = serve_sweep.parse_args(["--fp4moe", "x", "--model", "m", "--out", "o"])

        class S:
            pass
        s = S()
        s.a = a
        got = [serve_sweep.Sweep.prompts_for(s, c) for c in CAPS]
        self.assertEqual(got, [64, 128, 512, 1024, 2048])

    def test_id_tokenizer_covers_the_vocabulary(self):
        with tempfile.TemporaryDirectory() as d:
            serve_sweep.write_id_tokenizer(d, 1000)
            with open(os.path.join(d, "tokenizer.json")) as f:
                t = json.load(f)
        ids = sorted(t["model"]["vocab"].values()) + [x["id"] for x in t["added_tokens"]]
        self.assertEqual(ids, list(range(1000)))
        self.assertEqual(len(set(t["model"]["vocab"])), 999)


if __name__ == "__main__":
    unittest.main(verbosity=2)
