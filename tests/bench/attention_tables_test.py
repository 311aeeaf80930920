#!/usr/bin/env python3
"""bench/attention_tables.py on a made-up `fp4moe bench attention --json` (two BF16 decode points,
three paths, one sparse point with its alternative indexer / top-k rows and the one-graph pipeline): a table row per result with % of copy BW from bytes / µs, and the
--plot PNG is written (when matplotlib is installed)."""
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

import attention_tables  # noqa: E402

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def result(kind, path, b, ctx, us):
    return {"kind": kind, "kv": "bf16", "path": path, "batch": b, "ctx": ctx, "us": us,
            "bytes": 1.0e6 * b * ctx / 1024, "flops": 1.0e9, "x_floor": 1.0, "note": ""}


def made_up():
    rows = []
    for b, ctx in ((1, 1024), (16, 8192)):
        rows += [result("decode", "flashinfer-sm90", b, ctx, 50.0), result("decode", "flashinfer-sm90-dev", b, ctx, 55.0),
                 result("decode", "ours-mma-dev", b, ctx, 100.0)]
    rows += [result("sparse-mla", "flashinfer-sm90-ps1", 16, 8192, 30.0),
             result("sparse-mla", "flashinfer-sm90-ps1-dev", 16, 8192, 33.0),
             result("indexer", "ours-mma", 16, 8192, 20.0), result("indexer", "ours-mma+fused-q", 16, 8192, 21.0),
             result("indexer", "ours-mma-4waves", 16, 8192, 35.0),
             result("topk", "ours-radix", 16, 8192, 40.0),
             result("topk", "ours-radix-wide", 16, 8192, 25.0), result("topk", "flashinfer-topk", 16, 8192, 30.0),
             dict(result("sparse-decode", "indexer+topk+flashinfer", 16, 8192, 90.0), note="vs dense 0.80x"),
             dict(result("sparse-decode", "graph:indexer+topk+flashinfer-dev", 16, 8192, 80.0), x_floor=2.0),
             dict(result("key-writes", "runner-unfused-5", 16, 1, 20.0), x_floor=10.0),
             dict(result("key-writes", "fused-2", 16, 1, 8.0), x_floor=4.0)]
    return {"ceilings": {"copy_gbps": 4000.0, "bf16_tflops": 800.0, "fp8_tflops": 1500.0}, "device": "test GPU",
            "page_size": 64, "top_k": 2048, "results": rows}


class AttentionTables(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.json = os.path.join(self.dir.name, "a.json")
        with open(self.json, "w") as f:
            json.dump(made_up(), f)

    def tearDown(self):
        self.dir.cleanup()

    def test_decode_table_has_a_row_per_result_with_copy_share(self):
        out = io.StringIO()
        with redirect_stdout(out):
            attention_tables.main(self.json)
        lines = [l for l in out.getvalue().splitlines() if l.startswith("| flashinfer") or l.startswith("| ours")]
        self.assertEqual(len(lines), 6)
        # B 16 / 8K at 50 µs: 128 MB / 50 µs = 2560 GB/s = 64.0 % of 4000
        row = [l for l in lines if l.startswith("| flashinfer-sm90 | 16 | 8192 |")]
        self.assertEqual(len(row), 1)
        self.assertIn("| 2560 |", row[0])
        self.assertIn("64.0 %", row[0])

    def test_sparse_table_takes_the_default_topk_and_indexer_and_shows_the_alternatives_and_the_graph_beside(self):
        out = io.StringIO()
        with redirect_stdout(out):
            attention_tables.main(self.json)
        rows = [l for l in out.getvalue().splitlines() if l.startswith("| 16 | 8192 |")]
        self.assertEqual(len(rows), 1)
        self.assertIn("| 40.0 (wide slices: 25.0) (FlashInfer: 30.0) |", rows[0])
        self.assertIn("| 16 | 8192 | 20.0 (1.00×) (4 waves: 35.0) |", rows[0])  # the plain indexer row, not the fused-query one
        self.assertIn("| 90.0 (indexer+topk+flashinfer) | 1.00× | 80.0 (2.00×) | 0.80x |", rows[0])  # stream, then graph

    def test_key_writes_table_puts_the_fused_time_beside_the_unfused(self):
        out = io.StringIO()
        with redirect_stdout(out):
            attention_tables.main(self.json)
        self.assertIn("| 16 | 1 | 20.0 (10.00×) | 8.0 (4.00×) | 0.40x |", out.getvalue())

    @unittest.skipUnless(HAVE_MPL, "matplotlib not installed")
    def test_plot_writes_a_png(self):
        png = os.path.join(self.dir.name, "p.png")
        attention_tables.plot(self.json, png)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
