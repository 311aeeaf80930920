#!/usr/bin/env python3
"""`fp4moe bench serve` against `fp4moe serve --backend cpu` on the tiny synthetic model.

Usage: bench_serve_cpu_test.py PATH/TO/fp4moe

Checks (issue 17's CI requirement): a short random-dataset run at max concurrency 4 has every
request succeed, the printed report has SGLang's layout, and the --output-file JSON line parses
with the exact token totals (fixed lengths, ignore_eos); a JSONL dataset run the same; an
unreachable server is one error line and exit 1. Python's standard library only.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

BINARY = None
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BenchServeAgainstCpuServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fp4moe_bench_serve_")
        cls.model = os.path.join(cls.dir, "model")
        subprocess.run([BINARY, "make-synthetic", cls.model, "--preset", "glm5-tiny"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        shutil.copy(os.path.join(HERE, "..", "text", "data", "behaviors", "tokenizer.json"), cls.model)
        cls.port = free_port()
        cls.url = f"http://127.0.0.1:{cls.port}"
        cls.log = open(os.path.join(cls.dir, "serve.log"), "w")
        cls.proc = subprocess.Popen([BINARY, "serve", "--model", cls.model, "--backend", "cpu", "--port", str(cls.port),
                                     "--max-running-requests", "8", "--num-continuous-decode-steps", "2",
                                     "--decode-log-interval", "0"], stdout=cls.log, stderr=cls.log)
        deadline = time.time() + 60
        while True:
            if cls.proc.poll() is not None:
                raise RuntimeError(f"server exited with {cls.proc.returncode}")
            try:
                if urllib.request.urlopen(cls.url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("/health never returned 200")
            time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        rc = cls.proc.wait(30)
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)
        assert rc == 0, f"server exit code {rc}"

    def bench(self, *args):
        out = os.path.join(self.dir, f"report_{time.monotonic_ns()}.jsonl")
        p = subprocess.run([BINARY, "bench", "serve", "--base-url", self.url, "--output-file", out, "--output-details",
                            *args], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 1)
        return p.stdout, json.loads(lines[0])

    def test_random_dataset_every_request_succeeds_and_the_report_parses(self):
        stdout, r = self.bench("--num-prompts", "8", "--random-input-len", "24", "--random-output-len", "6",
                               "--random-range-ratio", "1.0", "--max-concurrency", "4", "--seed", "3")
        self.assertIn("============ Serving Benchmark Result ============", stdout)
        self.assertIn("Successful requests:                     8", stdout)
        self.assertIn("Failed requests:                         0", stdout)
        for head in ("End-to-End Latency", "Time to First Token", "Time per Output Token (excl. 1st token)",
                     "Inter-Token Latency"):
            self.assertIn(head, stdout)
        self.assertEqual(r["completed"], 8)
        self.assertEqual(r["failed"], 0)
        self.assertEqual(r["max_concurrency"], 4)
        self.assertEqual(r["request_rate"], "inf")
        self.assertEqual(r["total_input_tokens"], 8 * 24)
        self.assertEqual(r["total_output_tokens"], 8 * 6)
        self.assertEqual(r["output_lens"], [6] * 8)
        self.assertEqual(r["errors"], [""] * 8)
        self.assertGreater(r["duration"], 0)
        self.assertGreater(r["output_throughput"], 0)
        self.assertTrue(all(t > 0 for t in r["ttfts"]))
        self.assertLessEqual(r["median_ttft_ms"], r["p99_ttft_ms"])

    def test_jsonl_dataset_at_a_poisson_rate(self):
        path = os.path.join(self.dir, "prompts.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"prompt": "hello there", "output_len": 5}) + "\n")
            f.write(json.dumps({"prompt": [5, 17, 300, 42]}) + "\n")
        _, r = self.bench("--dataset-name", "jsonl", "--dataset-path", path, "--num-prompts", "4",
                          "--random-output-len", "3", "--request-rate", "50")
        self.assertEqual((r["completed"], r["failed"]), (4, 0))
        self.assertEqual(r["output_lens"], [5, 3, 5, 3])
        self.assertEqual(r["input_lens"][1], 4)
        self.assertEqual(r["request_rate"], 50)

    def test_an_unreachable_server_is_one_line_and_exit_1(self):
        p = subprocess.run([BINARY, "bench", "serve", "--base-url", f"http://127.0.0.1:{free_port()}",
                            "--num-prompts", "2"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("/v1/models", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        print("usage: bench_serve_cpu_test.py PATH/TO/fp4moe [unittest args]")
        sys.exit(2)
    BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
