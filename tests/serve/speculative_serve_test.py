#!/usr/bin/env python3
"""`fp4moe serve --speculative-algorithm NEXTN` on the CPU backend (make-synthetic glm5-tiny).

Usage: speculative_serve_test.py PATH/TO/fp4moe

Checks: concurrent greedy /generate requests (some with stop_token_ids, various max_new_tokens)
give the same output_ids and finish reasons as a server without speculation; meta_info and the
OpenAI usage carry spec_verify_ct (1 <= it <= completion tokens); /metrics has the draft /
accepted counters and the accept-length histogram; a checkpoint without an MTP layer, a
--speculative-eagle-topk other than 1, --num-continuous-decode-steps > 1 and
--speculative-disable-by-batch-size without speculation or below 1 are one line and a non-zero
exit; with --speculative-disable-by-batch-size 2 the output is still the plain server's and
/get_server_info names it. Python's standard library only.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from socket_util import free_port  # noqa: E402

BINARY = None
HERE = os.path.dirname(os.path.abspath(__file__))


def start(model, *extra):
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([BINARY, "serve", "--model", model, "--backend", "cpu", "--port", str(port),
                             "--kv-cache-dtype", "f32", "--max-running-requests", "4", "--decode-log-interval", "0",
                             *extra], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read().decode()[-2000:]}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return proc, url, log
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError("/health never returned 200")
        time.sleep(0.05)


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def requests():
    out = []
    for i in range(6):
        ids = [(11 + 53 * j + 97 * i) % 790 + 2 for j in range(5 + 7 * i)]  # the tokenizer's 801 ids
        sp = {"max_new_tokens": 6 + 5 * i, "temperature": 0, "ignore_eos": True}
        if i % 3 == 1:
            sp["stop_token_ids"] = [500 + i]
        out.append({"input_ids": ids, "sampling_params": sp})
    return out


def run_concurrently(url, bodies):
    results = [None] * len(bodies)

    def one(k):
        results[k] = post(url, "/generate", bodies[k])

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class SpeculativeServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fp4moe_spec_serve_")
        cls.model = os.path.join(cls.dir, "model")
        cls.nomtp = os.path.join(cls.dir, "nomtp")
        for d, extra in ((cls.model, []), (cls.nomtp, ["--mtp-layers", "0"])):
            subprocess.run([BINARY, "make-synthetic", d, "--preset", "glm5-tiny", *extra], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
            shutil.copy(os.path.join(HERE, "..", "text", "data", "behaviors", "tokenizer.json"), d)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def stop(self, proc, log):
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0)
        log.close()

    def test_greedy_output_equals_the_plain_server_and_the_counters_show(self):
        plain, purl, plog = start(self.model)
        try:
            want = run_concurrently(purl, requests())
        finally:
            self.stop(plain, plog)
        spec, surl, slog = start(self.model, "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3")
        try:
            got = run_concurrently(surl, requests())
            for w, g in zip(want, got):
                self.assertEqual(g["output_ids"], w["output_ids"])
                self.assertEqual(g["meta_info"]["finish_reason"], w["meta_info"]["finish_reason"])
                n = g["meta_info"]["completion_tokens"]
                self.assertGreaterEqual(g["meta_info"]["spec_verify_ct"], 1)
                self.assertLessEqual(g["meta_info"]["spec_verify_ct"], n)
                self.assertNotIn("spec_verify_ct", w["meta_info"])
            c = post(surl, "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0})
            self.assertGreaterEqual(c["usage"]["spec_verify_ct"], 1)
            with urllib.request.urlopen(surl + "/metrics", timeout=10) as r:
                m = r.read().decode()
            values = {}
            for line in m.splitlines():
                if line.startswith("fp4moe_spec_"):
                    name, v = line.rsplit(" ", 1)
                    values[name] = float(v)
            self.assertGreater(values["fp4moe_spec_draft_tokens_total"], 0)
            self.assertGreaterEqual(values["fp4moe_spec_draft_tokens_total"], values["fp4moe_spec_accepted_tokens_total"])
            self.assertEqual(values["fp4moe_spec_accept_length_count"], values["fp4moe_spec_verify_steps_total"])
            self.assertIn('fp4moe_spec_accept_length_bucket{le="4"}', m)
            self.assertIn("fp4moe_spec_disabled_rounds_total 0\n", m)
            with urllib.request.urlopen(surl + "/get_server_info", timeout=10) as r:
                self.assertIsNone(json.loads(r.read())["speculative_disable_by_batch_size"])
        finally:
            self.stop(spec, slog)
        # --speculative-disable-by-batch-size 2: rounds of more than two running requests are plain
        # steps; the output is the plain server's (which rounds switch depends on arrival timing:
        # tests/engine/speculative_disable_test.cpp checks the switching itself).
        off, ourl, olog = start(self.model, "--speculative-algorithm", "NEXTN", "--speculative-disable-by-batch-size", "2")
        try:
            got = run_concurrently(ourl, requests())
            for w, g in zip(want, got):
                self.assertEqual(g["output_ids"], w["output_ids"])
                self.assertEqual(g["meta_info"]["finish_reason"], w["meta_info"]["finish_reason"])
            with urllib.request.urlopen(ourl + "/get_server_info", timeout=10) as r:
                self.assertEqual(json.loads(r.read())["speculative_disable_by_batch_size"], 2)
            with urllib.request.urlopen(ourl + "/metrics", timeout=10) as r:
                self.assertIn("fp4moe_spec_disabled_rounds_total", r.read().decode())
        finally:
            self.stop(off, olog)

    def refused(self, model, *extra):
        p = subprocess.run([BINARY, "serve", "--model", model, "--backend", "cpu", "--port", str(free_port()), *extra],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, p.stderr)
        return lines[0]

    def test_bad_flags_and_a_checkpoint_without_mtp_are_one_line_and_a_nonzero_exit(self):
        self.assertIn("no MTP layer", self.refused(self.nomtp, "--speculative-algorithm", "NEXTN"))
        self.assertIn("--speculative-eagle-topk 2", self.refused(self.model, "--speculative-algorithm", "NEXTN",
                                                                 "--speculative-eagle-topk", "2"))
        self.assertIn("--num-continuous-decode-steps 4",
                      self.refused(self.model, "--speculative-algorithm", "EAGLE", "--num-continuous-decode-steps", "4"))
        self.assertIn("need --speculative-algorithm", self.refused(self.model, "--speculative-num-steps", "2"))
        self.assertIn("--speculative-disable-by-batch-size needs --speculative-algorithm",
                      self.refused(self.model, "--speculative-disable-by-batch-size", "4"))
        self.assertIn("--speculative-disable-by-batch-size 0 must be at least 1",
                      self.refused(self.model, "--speculative-algorithm", "NEXTN", "--speculative-disable-by-batch-size", "0"))


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
