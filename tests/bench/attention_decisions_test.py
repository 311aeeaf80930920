#!/usr/bin/env python3
"""bench/attention_decisions.py on a made-up `fp4moe bench attention --json` (one B x ctx point with
every row the two tables read): each ratio printed is the quotient of the rows it names (FlashInfer's
share of copy bandwidth, ours / FlashInfer, the split rule / the best forced split, the pipeline /
the floor chain, PDL / graph, each top-k variant / the radix top-k), and a point missing a row is
left out instead of failing."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

import attention_decisions  # noqa: E402


def row(kind, path, us, b=16, ctx=32768, **extra):
    r = {"kind": kind, "kv": "bf16", "path": path, "batch": b, "ctx": ctx, "us": us, "bytes": 2.0e8,
         "flops": 1.0e9, "x_floor": us / 50.0, "note": ""}
    r.update(extra)
    return r


def made_up():
    rows = [row("decode", "flashinfer-sm90", 100.0), row("decode", "floor-move", 80.0), row("decode", "ours-mma", 150.0),
            row("decode", "ours-wgmma", 165.0), row("decode", "flashinfer-sm90-dev", 110.0),
            row("decode", "flashinfer-sm90-dev-s2", 220.0), row("decode", "flashinfer-sm90-dev-s8", 125.0),
            row("sparse-decode", "indexer+topk+flashinfer", 70.0, note="vs dense 1.2x; top-k ours-radix-sample64"),
            row("sparse-decode", "graph:indexer+topk+flashinfer-dev", 60.0),
            row("sparse-decode", "graph+pdl:indexer+topk+flashinfer-dev", 63.0),
            row("sparse-decode", "floor-chain3", 40.0), row("sparse-decode", "floor-chain5", 48.0),
            row("indexer", "ours-mma", 20.0), row("topk", "ours-radix", 10.0), row("topk", "ours-radix-sample64", 8.0),
            row("topk", "ours-radix-sample128", 9.0), row("topk", "flashinfer-topk", 12.0),
            # a second point with no dense FlashInfer row and no pipeline: left out of both tables
            row("decode", "ours-mma", 10.0, b=1), row("topk", "ours-radix", 5.0, b=1)]
    return {"ceilings": {"copy_gbps": 4000.0, "bf16_tflops": 800.0, "fp8_tflops": 1500.0}, "device": "test GPU",
            "commit": "abc1234", "l2_flush": "read", "page_size": 64, "top_k": 2048, "results": rows}


class AttentionDecisions(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.json = os.path.join(self.dir.name, "a.json")
        with open(self.json, "w") as f:
            json.dump(made_up(), f)
        out = io.StringIO()
        with redirect_stdout(out):
            attention_decisions.main(self.json, "bf16")
        self.rows = [l for l in out.getvalue().splitlines() if l.startswith("| 16 ") or l.startswith("| 1 ")]

    def tearDown(self):
        self.dir.cleanup()

    def test_dense_row_holds_the_quotients_of_its_rows(self):
        cells = [c.strip() for c in self.rows[0].strip("|").split("|")]
        # 2e8 bytes in 100 us = 2000 GB/s = 50 % of 4000; 100 / 80; 150 / 100; 165 / 150; 110 / min(220, 125)
        self.assertEqual(cells, ["16", "32768", "100.0", "50.0 %", "1.25", "1.50", "1.10", "0.88"])

    def test_pipeline_row_holds_the_quotients_of_its_rows(self):
        cells = [c.strip() for c in self.rows[1].strip("|").split("|")]
        # the graph over the padded floor chain (floor-chain5): 60 / 48; PDL 63 / 60; top-k variants over 10;
        # no one-CTA row: a dash
        self.assertEqual(cells, ["16", "32768", "60.0", "flashinfer-dev", "1.20", "0.80", "1.25", "1.05", "0.40",
                                 "ours-radix-sample64", "–", "0.80", "0.90", "1.20"])

    def test_a_point_missing_rows_is_left_out(self):
        self.assertEqual(len(self.rows), 2)
        self.assertFalse(any(l.startswith("| 1 ") for l in self.rows))


if __name__ == "__main__":
    unittest.main()
