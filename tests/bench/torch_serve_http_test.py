#!/usr/bin/env python3
"""bench/torch_serve's HTTP server: starts the real server (CPU) on a tiny model and checks a
streaming and a non-streaming completion, chat, the info routes and 4xx answers.

Model: `fp4moe make-synthetic --preset glm5-tiny` (NVFP4 experts in NVIDIA's layout, index_topk
32) when FP4MOE_BIN names the fp4moe binary, else tests/model/golden/glm5-tiny-dense/model.
Exit 77 (CTest: skipped) without torch.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch  # noqa: F401  (the server needs it)
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FP4MOE = os.environ.get("FP4MOE_BIN", "")


def sse_payloads(body: str):
    return [line[len("data: "):] for line in body.split("\n") if line.startswith("data: ")]


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="torch_serve_http_")
        if FP4MOE:
            cls.model = os.path.join(cls.tmp.name, "glm5-tiny")
            subprocess.run([FP4MOE, "make-synthetic", cls.model, "--preset", "glm5-tiny"], check=True, capture_output=True)
        else:
            cls.model = os.path.join(ROOT, "tests", "model", "golden", "glm5-tiny-dense", "model")
        cls.log = open(os.path.join(cls.tmp.name, "server.log"), "w+")
        cls.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "bench", "torch_serve", "serve.py"), "--model", cls.model, "--port", "0",
             "--threads", "1", "--max-running-requests", "4", "--served-model-name", "tiny"],
            stderr=cls.log, stdout=cls.log)
        cls.port = None
        for _ in range(1200):
            cls.log.seek(0)
            m = re.search(r"serving 'tiny' on http://127\.0\.0\.1:(\d+)", cls.log.read())
            if m:
                cls.port = int(m.group(1))
                break
            if cls.proc.poll() is not None:
                break
            time.sleep(0.05)
        if cls.port is None:
            cls.log.seek(0)
            cls.tearDownClass()
            raise RuntimeError("the server did not start:\n" + cls.log.read())

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        cls.log.close()
        cls.tmp.cleanup()

    def request(self, method, path, body=None, conn=None):
        c = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(method, path, body=None if body is None else json.dumps(body) if not isinstance(body, str) else body,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out = r.status, r.read().decode()
        if conn is None:
            c.close()
        return out

    def test_streaming_and_whole_completions_give_the_same_greedy_tokens(self):
        body = {"model": "tiny", "prompt": [5, 17, 300, 9, 44, 2], "max_tokens": 12, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)  # both on one keep-alive connection
        status, text = self.request("POST", "/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}),
                                    conn)
        self.assertEqual(status, 200, text)
        payloads = sse_payloads(text)
        self.assertEqual(payloads[-1], "[DONE]")
        chunks = [json.loads(p) for p in payloads[:-1]]
        self.assertEqual(chunks[-1]["usage"], {"prompt_tokens": 6, "completion_tokens": 12, "total_tokens": 18})
        token_chunks = [c for c in chunks if c["choices"]]
        self.assertEqual(len(token_chunks), 12)
        self.assertTrue(all(c["choices"][0]["text"] for c in token_chunks))  # every token has text
        self.assertEqual([c["choices"][0]["finish_reason"] for c in token_chunks], [None] * 11 + ["length"])
        streamed = [c["choices"][0]["token_ids"][0] for c in token_chunks]

        status, text = self.request("POST", "/v1/completions", body, conn)
        self.assertEqual(status, 200, text)
        whole = json.loads(text)
        self.assertEqual(whole["object"], "text_completion")
        self.assertEqual(whole["choices"][0]["token_ids"], streamed)
        self.assertEqual(whole["choices"][0]["text"], "".join(c["choices"][0]["text"] for c in token_chunks))
        self.assertEqual(whole["usage"]["completion_tokens"], 12)
        conn.close()

    def test_chat_and_text_prompts(self):
        status, text = self.request("POST", "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0})
        self.assertEqual(status, 200, text)
        j = json.loads(text)
        self.assertEqual(j["choices"][0]["message"]["role"], "assistant")
        self.assertEqual(j["usage"]["prompt_tokens"], len("<|user|>\nhi\n<|assistant|>\n"))
        status, text = self.request("POST", "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True})
        self.assertEqual(status, 200, text)
        chunks = [json.loads(p) for p in sse_payloads(text)[:-1]]
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(sum(1 for c in chunks if c["choices"][0]["delta"].get("content")), 2)
        status, text = self.request("POST", "/v1/completions", {"prompt": "héllo", "max_tokens": 1})
        self.assertEqual(json.loads(text)["usage"]["prompt_tokens"], 6)  # UTF-8 bytes

    def test_info_routes(self):
        status, text = self.request("GET", "/health")
        self.assertEqual(status, 200)
        status, text = self.request("GET", "/v1/models")
        self.assertEqual(json.loads(text)["data"][0]["id"], "tiny")
        status, text = self.request("GET", "/get_model_info")
        self.assertGreater(json.loads(text)["vocab_size"], 256)

    def test_bad_requests_get_openai_errors(self):
        cases = [
            ("POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 4000}, 400),  # past index_topk
            ("POST", "/v1/completions", {"prompt": [1, 10 ** 9]}, 400),
            ("POST", "/v1/completions", {"prompt": []}, 400),
            ("POST", "/v1/completions", {"prompt": [1], "max_tokens": 0}, 400),
            ("POST", "/v1/completions", {"prompt": [1], "n": 2}, 400),
            ("POST", "/v1/completions", {"prompt": [1], "stream": "yes"}, 400),
            ("POST", "/v1/completions", {"model": "other", "prompt": [1]}, 404),
            ("POST", "/v1/completions", '{"prompt": [1', 400),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user"}]}, 400),
            ("GET", "/v1/completions", None, 405),
            ("GET", "/nowhere", None, 404),
        ]
        for method, path, body, want in cases:
            status, text = self.request(method, path, body)
            self.assertEqual(status, want, (body, text))
            self.assertIn("message", json.loads(text)["error"])
        self.assertEqual(self.request("GET", "/health")[0], 200)  # still serving


if __name__ == "__main__":
    unittest.main()
