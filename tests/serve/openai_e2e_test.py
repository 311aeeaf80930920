#!/usr/bin/env python3
"""End-to-end tests of `fp4moe serve` with the real `openai` client against the real binary.

Usage: openai_e2e_test.py PATH/TO/fp4moe        (exit 77 = skipped: the openai package is missing)

Starts `fp4moe serve --backend fake` (the deterministic paged test model and the byte-level
tokenizer) on free ports and checks: chat and completions, streaming and not; stop strings that
span tokens; n=2; logprobs; seeds; /generate; 64 concurrent streaming clients each with its own
expected output; clients that disconnect; prefix reuse in /metrics with outputs unchanged;
retraction forced by a tiny KV pool with outputs unchanged; 429, 503 while loading, slow
clients, SIGTERM, 503 after a backend failure; >= 30 malformed inputs with their status and
error JSON; and at the end that the engine still serves and every KV page is free.
Also `--backend cpu` (and, with FP4MOE_E2E_CUDA=1 on a GPU, `--backend cuda`) on a toy GLM-5 (make-synthetic glm5-tiny) with a real tokenizer: the same
tokens as `fp4moe generate`, chat and concurrent streams, and /metrics counting every routed
token (tokens per expert per MoE GEMM) and every step's batch; `tools`, `tool_choice: "none"` and a
tool follow-up with `chat_template_kwargs` rendered by a test template (checked through /tokenize
and /detokenize against its Python mirror), refused fields with the openai client's exceptions,
and RSS back near its level after a large prompt. Issue 37's refused fields and the byte-length
refusal of over-long prompts are in test_malformed_inputs.
"""
import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from socket_util import free_port  # noqa: E402

try:
    import openai
except ImportError:
    print("SKIP: the openai package is not installed")
    sys.exit(77)

BINARY = None
API_KEY = "test-key"


class ServerProcess:
    def __init__(self, *extra, api_key=None, wait_ready=True, backend="fake"):
        self.port = free_port()
        args = [BINARY, "serve", "--backend", backend, "--port", str(self.port), "--decode-log-interval", "0"]
        if api_key:
            args += ["--api-key", api_key]
        args += list(extra)
        self.log = open(os.devnull, "w") if not os.environ.get("FP4MOE_E2E_LOG") else sys.stderr
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
        self.api_key = api_key
        if wait_ready:
            self.wait_health(200)

    def wait_health(self, status, limit=20.0):
        deadline = time.time() + limit
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if self.request("GET", "/health")[0] == status:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"/health never returned {status}")

    def request(self, method, path, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data, r.getheader("Content-Type")

    def json(self, method, path, body=None):
        status, data, _ = self.request(method, path, body)
        return status, json.loads(data) if data else None

    def metrics(self):
        status, data, _ = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def client(self):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=self.api_key or "none",
                             timeout=60, max_retries=0)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not sys.stderr:
            self.log.close()
        return self.proc.returncode


def wait_until(pred, limit=10.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def prompt(i):
    return f"request {i}: tell me about the number {i * 7919 % 1000}"


class MainServer(unittest.TestCase):
    """One server: 1 ms per model step, K = 4, an API key."""

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--fake-step-delay-us", "1000", "--num-continuous-decode-steps", "4",
                                   "--page-size", "4", "--max-running-requests", "64", "--served-model-name", "fake-glm",
                                   api_key=API_KEY)
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        assert rc == 0, f"server exit code {rc}"

    def complete(self, p, **kw):
        kw.setdefault("max_tokens", 24)
        kw.setdefault("temperature", 0)
        return self.client.completions.create(model="fake-glm", prompt=p, **kw)

    def stream_text(self, **kw):
        texts, finish, usage = {}, {}, None
        for chunk in self.client.completions.create(model="fake-glm", stream=True, **kw):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
        return texts, finish, usage

    def test_completions_stream_and_not_agree_with_generate(self):
        r = self.complete("hello there", max_tokens=30, extra_body={"ignore_eos": True})
        text = r.choices[0].text
        self.assertEqual(len(text), 30)  # one byte per token, all printable
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, len("hello there"))
        self.assertEqual(r.usage.completion_tokens, 30)
        self.assertEqual(r.model, "fake-glm")
        texts, finish, usage = self.stream_text(prompt="hello there", max_tokens=30, temperature=0,
                                                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        self.assertEqual(texts[0], text)
        self.assertEqual(finish[0], "length")
        self.assertEqual(usage.completion_tokens, 30)
        status, g = self.server.json("POST", "/generate", {
            "input_ids": list(b"hello there"), "sampling_params": {"max_new_tokens": 30, "temperature": 0,
                                                                   "ignore_eos": True}})
        self.assertEqual(status, 200)
        self.assertEqual(g["text"], text)
        self.assertEqual(g["output_ids"], list(text.encode()))
        self.assertEqual(g["meta_info"]["finish_reason"]["type"], "length")
        # The same prompt given as token ids.
        r2 = self.complete(list(b"hello there"), max_tokens=30, extra_body={"ignore_eos": True})
        self.assertEqual(r2.choices[0].text, text)

    def test_chat_stream_and_not(self):
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
        r = self.client.chat.completions.create(model="fake-glm", messages=msgs, max_tokens=20, temperature=0)
        content = r.choices[0].message.content
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(r.usage.completion_tokens, len(content) + (1 if r.choices[0].finish_reason == "stop" else 0))
        # The chat template of the stand-in tokenizer: the prompt is the rendered conversation.
        status, tok = self.server.json("POST", "/tokenize", {"messages": msgs})
        self.assertEqual(status, 200)
        self.assertEqual(r.usage.prompt_tokens, tok["count"])
        parts, finish, usage, roles = [], None, None, 0
        for chunk in self.client.chat.completions.create(model="fake-glm", messages=msgs, max_tokens=20, temperature=0,
                                                         stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                roles += c.delta.role == "assistant"
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        self.assertEqual("".join(parts), content)
        self.assertEqual(finish, r.choices[0].finish_reason)
        self.assertEqual(roles, 1)
        self.assertEqual(usage.total_tokens, r.usage.total_tokens)

    def test_eos_ends_with_finish_reason_stop(self):
        found = False
        for i in range(40):
            r = self.complete(prompt(i), max_tokens=200)
            if r.choices[0].finish_reason == "stop":
                found = True
                self.assertLess(len(r.choices[0].text), 200)
                self.assertEqual(r.usage.completion_tokens, len(r.choices[0].text) + 1)  # the EOS token counts
                break
        self.assertTrue(found, "no request ended on EOS")

    def test_stop_strings_spanning_tokens(self):
        full = self.complete("stop strings", max_tokens=60, extra_body={"ignore_eos": True}).choices[0].text
        stop = full[20:24]  # four tokens
        cut = full[:full.index(stop)]
        r = self.complete("stop strings", max_tokens=60, stop=[stop, "\u00e9\u00e9\u00e9"], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, cut)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].model_extra.get("matched_stop"), stop)
        self.assertEqual(r.usage.completion_tokens, full.index(stop) + len(stop))
        texts, finish, _ = self.stream_text(prompt="stop strings", max_tokens=60, temperature=0, stop=stop,
                                            extra_body={"ignore_eos": True})
        self.assertEqual(texts[0], cut)
        self.assertEqual(finish[0], "stop")
        # Chat, streaming: the same cut.
        msgs = [{"role": "user", "content": "stop strings"}]
        full_chat = self.client.chat.completions.create(model="fake-glm", messages=msgs, max_tokens=60, temperature=0,
                                                        extra_body={"ignore_eos": True}).choices[0].message.content
        stop2 = full_chat[10:13]
        got = "".join(c.choices[0].delta.content or "" for c in self.client.chat.completions.create(
            model="fake-glm", messages=msgs, max_tokens=60, temperature=0, stop=stop2, stream=True,
            extra_body={"ignore_eos": True}) if c.choices)
        self.assertEqual(got, full_chat[:full_chat.index(stop2)])

    def test_n_2(self):
        r = self.complete("two choices", n=2, temperature=1.0, seed=5, max_tokens=30, extra_body={"ignore_eos": True})
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        self.assertNotEqual(r.choices[0].text, r.choices[1].text)
        self.assertEqual(r.usage.completion_tokens, 60)
        self.assertEqual(r.usage.prompt_tokens, len("two choices"))
        texts, finish, _ = self.stream_text(prompt="two choices", n=2, temperature=1.0, seed=5, max_tokens=30,
                                            extra_body={"ignore_eos": True})
        self.assertEqual(texts, {0: r.choices[0].text, 1: r.choices[1].text})
        self.assertEqual(finish, {0: "length", 1: "length"})
        g = self.complete("two choices", n=2, max_tokens=10)
        self.assertEqual(g.choices[0].text, g.choices[1].text)  # greedy choices agree
        chat = self.client.chat.completions.create(model="fake-glm", messages=[{"role": "user", "content": "x"}], n=2,
                                                   max_tokens=5, temperature=0.8, seed=1)
        self.assertEqual(len(chat.choices), 2)

    def test_logprobs(self):
        r = self.client.chat.completions.create(model="fake-glm", messages=[{"role": "user", "content": "lp"}],
                                                max_tokens=12, temperature=0, logprobs=True, top_logprobs=3,
                                                extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 12)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertEqual(t.top_logprobs[0].token, t.token)  # greedy: the sampled token is the best
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
            self.assertEqual(bytes(t.bytes).decode(), t.token)
        c = self.complete("lp", max_tokens=8, logprobs=2, extra_body={"ignore_eos": True})
        lp = c.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 8)
        self.assertEqual(len(lp.top_logprobs[0]), 2)
        self.assertEqual(lp.text_offset[:3], [0, 1, 2])
        # Streaming carries them per chunk.
        n = 0
        for chunk in self.client.completions.create(model="fake-glm", prompt="lp", max_tokens=8, temperature=0,
                                                    logprobs=1, stream=True, extra_body={"ignore_eos": True}):
            for ch in chunk.choices:
                if ch.logprobs:
                    n += len(ch.logprobs.tokens)
        self.assertEqual(n, 8)

    def test_seeds_reproduce(self):
        a = self.complete("seeded", temperature=0.9, seed=42, max_tokens=40, extra_body={"ignore_eos": True})
        b = self.complete("seeded", temperature=0.9, seed=42, max_tokens=40, extra_body={"ignore_eos": True})
        c = self.complete("seeded", temperature=0.9, seed=43, max_tokens=40, extra_body={"ignore_eos": True})
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertNotEqual(a.choices[0].text, c.choices[0].text)
        g = self.complete("seeded", max_tokens=40, extra_body={"ignore_eos": True})
        self.assertNotEqual(a.choices[0].text, g.choices[0].text)

    def test_generate_native(self):
        status, r = self.server.json("POST", "/generate", {"text": ["ab", "cd"], "sampling_params": {
            "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}, "return_logprob": True, "top_logprobs_num": 2})
        self.assertEqual(status, 200)
        self.assertEqual(len(r), 2)
        self.assertEqual(len(r[0]["meta_info"]["output_token_logprobs"]), 6)
        self.assertEqual(len(r[0]["meta_info"]["output_top_logprobs"][0]), 2)
        status, body, ctype = self.server.request("POST", "/generate", {"text": "ab", "stream": True, "sampling_params": {
            "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith("text/event-stream"))
        events = [l[6:] for l in body.decode().split("\n") if l.startswith("data: ")]
        self.assertEqual(events[-1], "[DONE]")
        last = json.loads(events[-2])
        self.assertEqual(last["text"], r[0]["text"])
        self.assertEqual(last["meta_info"]["finish_reason"]["type"], "length")

    def test_info_endpoints(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["fake-glm"])
        status, info = self.server.json("GET", "/get_model_info")
        self.assertEqual((status, info["is_generation"]), (200, True))
        status, info = self.server.json("GET", "/get_server_info")
        self.assertEqual(status, 200)
        self.assertEqual(info["num_continuous_decode_steps"], 4)
        self.assertEqual(info["page_size"], 4)
        self.assertIn("KV pool", info["memory_plan"]["summary"])
        status, t = self.server.json("POST", "/tokenize", {"prompt": "h\u00e9"})
        self.assertEqual(t["tokens"], list("h\u00e9".encode()))
        status, d = self.server.json("POST", "/detokenize", {"tokens": t["tokens"]})
        self.assertEqual(d["text"], "h\u00e9")
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        self.assertEqual(self.server.request("GET", "/health_generate")[0], 200)

    def test_concurrent_streaming_clients_get_their_own_outputs(self):
        n = 64
        expected = [self.complete(prompt(i), max_tokens=32).choices[0].text for i in range(n)]
        start = threading.Barrier(n)

        def run(i):
            start.wait()
            out, finish = "", None
            for chunk in self.client.completions.create(model="fake-glm", prompt=prompt(i), max_tokens=32,
                                                        temperature=0, stream=True):
                for c in chunk.choices:
                    out += c.text
                    finish = c.finish_reason or finish
            return out, finish

        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            results = list(pool.map(run, range(n)))
        for i, (out, finish) in enumerate(results):
            self.assertEqual(out, expected[i], f"client {i}")
            self.assertIn(finish, ("stop", "length"))

    def test_disconnects_abort_and_free(self):
        aborted0 = self.server.metrics()['fp4moe_request_finished_total{finished_reason="abort"}']
        # A stream closed after a few chunks.
        stream = self.client.completions.create(model="fake-glm", prompt="long", max_tokens=5000, stream=True,
                                                extra_body={"ignore_eos": True})
        got = 0
        for chunk in stream:
            got += 1
            if got == 5:
                break
        stream.close()
        # A non-streaming request whose client leaves while it runs.
        s = socket.create_connection(("127.0.0.1", self.server.port))
        body = json.dumps({"prompt": "long too", "max_tokens": 5000, "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        time.sleep(0.3)
        s.close()
        self.assertTrue(wait_until(lambda: self.server.metrics()['fp4moe_request_finished_total{finished_reason="abort"}']
                                   >= aborted0 + 2, 5), "the disconnected requests were not aborted")
        self.assertTrue(wait_until(lambda: self.server.metrics()["fp4moe_num_running_requests"] == 0, 5))

    def test_prefix_reuse_is_in_metrics_and_keeps_outputs(self):
        long_prompt = "a long shared system prompt " * 8
        before = self.server.metrics()["fp4moe_cached_prompt_tokens_total"]
        a = self.complete(long_prompt + "first", max_tokens=16)
        b = self.complete(long_prompt + "first", max_tokens=16)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        cached = b.usage.prompt_tokens_details.cached_tokens
        self.assertGreaterEqual(cached, len(long_prompt) - 4)
        self.assertGreaterEqual(self.server.metrics()["fp4moe_cached_prompt_tokens_total"] - before, cached)
        # A prompt sharing only the prefix is served the same as without the cache.
        self.server.request("POST", "/flush_cache", {})
        cold = self.complete(long_prompt + "second", max_tokens=16)
        self.complete(long_prompt + "first", max_tokens=1)
        warm = self.complete(long_prompt + "second", max_tokens=16)
        self.assertEqual(cold.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertGreater(warm.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(cold.choices[0].text, warm.choices[0].text)

    def test_malformed_inputs(self):
        long = "x" * 9000  # over the 8192-token context
        cases = [
            # (path, body, status, param)
            ("/v1/completions", "not json", 400, None),
            ("/v1/completions", "{", 400, None),
            ("/v1/completions", "[]", 400, None),
            ("/v1/completions", "\"text\"", 400, None),
            ("/v1/completions", {}, 400, "prompt"),
            ("/v1/completions", {"prompt": 5}, 400, "prompt"),
            ("/v1/completions", {"prompt": []}, 400, "prompt"),
            ("/v1/completions", {"prompt": ""}, 400, "prompt"),
            ("/v1/completions", {"prompt": [[]]}, 400, "prompt"),
            ("/v1/completions", {"prompt": [1, "a"]}, 400, "prompt"),
            ("/v1/completions", {"prompt": [-1]}, 400, "prompt"),
            ("/v1/completions", {"prompt": [999999]}, 400, "prompt"),
            ("/v1/completions", {"prompt": "a", "max_tokens": "10"}, 400, "max_tokens"),
            ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
            ("/v1/completions", {"prompt": "a", "max_tokens": 1.5}, 400, "max_tokens"),
            ("/v1/completions", {"prompt": "a", "max_tokens": 8192}, 400, "max_tokens"),
            ("/v1/completions", {"prompt": long}, 400, "prompt"),
            ("/v1/completions", {"prompt": "y" * (8192 * 13)}, 400, "prompt"),  # refused on its bytes
            ("/v1/completions", {"prompt": "a", "temperature": -1}, 400, "temperature"),
            ("/v1/completions", {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
            ("/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
            ("/v1/completions", {"prompt": "a", "top_p": 1.5}, 400, "top_p"),
            ("/v1/completions", {"prompt": "a", "top_k": "5"}, 400, "top_k"),
            ("/v1/completions", {"prompt": "a", "top_k": 0}, 400, "top_k"),  # -1 is off (SGLang)
            ("/v1/completions", {"prompt": "a", "top_k": -2}, 400, "top_k"),
            ("/v1/completions", {"prompt": "a", "min_p": 2}, 400, "min_p"),
            ("/v1/completions", {"prompt": "a", "n": 0}, 400, "n"),
            ("/v1/completions", {"prompt": "a", "n": 1000}, 400, "n"),
            ("/v1/completions", {"prompt": "a", "stop": 5}, 400, "stop"),
            ("/v1/completions", {"prompt": "a", "stop": [1]}, 400, "stop"),
            ("/v1/completions", {"prompt": "a", "stop": [""]}, 400, "stop"),
            ("/v1/completions", {"prompt": "a", "stop_token_ids": [1 << 20]}, 400, "stop_token_ids"),
            ("/v1/completions", {"prompt": "a", "logprobs": 50}, 400, "logprobs"),
            ("/v1/completions", {"prompt": "a", "presence_penalty": 3}, 400, "presence_penalty"),
            ("/v1/completions", {"prompt": "a", "frequency_penalty": True}, 400, "frequency_penalty"),
            ("/v1/completions", {"prompt": "a", "repetition_penalty": 0}, 400, "repetition_penalty"),
            ("/v1/completions", {"prompt": "a", "seed": "x"}, 400, "seed"),
            ("/v1/completions", {"prompt": "a", "stream": "yes"}, 400, "stream"),
            ("/v1/completions", {"prompt": "a", "stream_options": 1}, 400, "stream_options"),
            ("/v1/completions", {"prompt": "a", "ignore_eos": 1}, 400, "ignore_eos"),
            ("/v1/completions", {"prompt": "a", "echo": True}, 400, "echo"),
            ("/v1/completions", {"prompt": "a", "logit_bias": {"1": 5}}, 400, "logit_bias"),
            ("/v1/completions", "[" * 100 + "]" * 100, 400, None),
            ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),
            ("/v1/chat/completions", {}, 400, "messages"),
            ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
            ("/v1/chat/completions", {"messages": []}, 400, "messages"),
            ("/v1/chat/completions", {"messages": ["hi"]}, 400, "messages[0]"),
            ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
            ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
             "messages[0].content[0].type"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400,
             "top_logprobs"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, 400, "logprobs"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
             400, "max_completion_tokens"),
            # Fields that are not implemented are refused, never silently ignored (issue 37); structured
            # output (issue 42) refuses what does not compile (structured_output_e2e_test.py has the rest).
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "regex": "(a+"}, 400, "regex"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "ebnf": "r"}, 400, "ebnf"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "json_schema": "{"}, 400,
             "json_schema"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 3}}, 400,
             "logit_bias"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
                                      "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True,
                                      "stream_options": {"continuous_usage_stats": True}}, 400,
             "stream_options.continuous_usage_stats"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"}, 400,
             "reasoning_effort"),
            ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400,
             "messages[0].tool_call_id"),
            ("/v1/completions", {"prompt": "a", "best_of": 3}, 400, "best_of"),
            ("/v1/completions", {"prompt": "a", "suffix": "b"}, 400, "suffix"),
            ("/v1/completions", {"prompt": "a", "seed": 18446744073709551616}, 400, "seed"),
            ("/generate", {"text": "a", "sampling_params": {"regex": "[^\\s\\S]"}}, 400, "sampling_params.regex"),
            ("/generate", {"text": "a", "sampling_params": {"json_schema": "{}", "regex": "a"}}, 400,
             "sampling_params.regex"),
            ("/generate", {"text": "a", "image_data": "x"}, 400, "image_data"),
            ("/generate", {}, 400, "text"),
            ("/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
            ("/generate", {"text": 5}, 400, "text"),
            ("/generate", {"text": "a", "sampling_params": 5}, 400, "sampling_params"),
            ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400, "sampling_params.max_new_tokens"),
            ("/generate", {"input_ids": ["a"]}, 400, "input_ids"),
            ("/tokenize", {}, 400, "prompt"),
            ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
            ("/detokenize", {"tokens": [100000]}, 400, "tokens"),
        ]
        self.assertGreaterEqual(len(cases), 30)
        for path, body, status, param in cases:
            with self.subTest(path=path, body=str(body)[:80]):
                got, data, ctype = self.server.request("POST", path, body)
                self.assert_error(got, data, ctype, status)
                if param is not None:
                    self.assertEqual(json.loads(data)["error"]["param"], param)
        # Context overflow names the lengths.
        got, data, ctype = self.server.request("POST", "/v1/completions", {"prompt": "abc", "max_tokens": 8190})
        self.assert_error(got, data, ctype, 400)
        err = json.loads(data)["error"]
        self.assertEqual(err["code"], "context_length_exceeded")
        self.assertIn("8192", err["message"])
        self.assertIn("8193", err["message"])
        # A prompt whose bytes cannot fit is refused before it is encoded: a token of the byte-level
        # stand-in is at most 13 bytes ("<|assistant|>"), so 8192 x 13 bytes are at least 8192 tokens.
        got, data, ctype = self.server.request("POST", "/v1/completions", {"prompt": "y" * (8192 * 13)})
        self.assert_error(got, data, ctype, 400)
        err = json.loads(data)["error"]
        self.assertEqual(err["code"], "context_length_exceeded")
        self.assertIn("at least 8193 tokens", err["message"])
        # Unknown model, unknown route, API key, body size, no Content-Length.
        got, data, ctype = self.server.request("POST", "/v1/completions", {"model": "other", "prompt": "a"})
        self.assert_error(got, data, ctype, 404)
        self.assertEqual(json.loads(data)["error"]["code"], "model_not_found")
        self.assert_error(*self.server.request("POST", "/v1/nothing", {}), 404)
        self.assert_error(*self.server.request("GET", "/v2/models"), 404)
        self.assert_error(*self.server.request("POST", "/v1/completions", {"prompt": "a"},
                                               {"Authorization": "Bearer wrong"}), 401)
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        conn.request("GET", "/v1/models")
        r = conn.getresponse()
        self.assert_error(r.status, r.read(), r.getheader("Content-Type"), 401)
        self.assert_error(*self.server.request("POST", "/v1/completions", b"x" * (33 << 20)), 413)
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        conn.request("POST", "/v1/completions", body=iter([b'{"prompt": "a"}']),
                     headers={"Authorization": "Bearer " + API_KEY, "Transfer-Encoding": "chunked"},
                     encode_chunked=True)
        r = conn.getresponse()
        self.assert_error(r.status, r.read(), r.getheader("Content-Type"), 411)
        # With the openai client: the right exception classes.
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model="fake-glm", prompt="a", temperature=5)
        with self.assertRaises(openai.NotFoundError):
            self.client.completions.create(model="nope", prompt="a")
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{self.server.port}/v1", api_key="bad",
                          max_retries=0).models.list()
        # Harmless fields and nulls are accepted; unknown fields are refused by name (issue 37).
        status, r = self.server.json("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2, "user": "u",
                                                                 "suffix": None, "logit_bias": {}, "echo": False})
        self.assertEqual(status, 200)
        status, r = self.server.json("POST", "/v1/completions", {"prompt": "a", "frobnicate": [1, {}]})
        self.assertEqual((status, r["error"]["param"]), (400, "frobnicate"))
        self.assertIn("unrecognized", r["error"]["message"])

    def assert_error(self, status, data, ctype, expected):
        self.assertEqual(status, expected, data[:300])
        self.assertTrue(ctype and ctype.startswith("application/json"), ctype)
        err = json.loads(data)["error"]
        self.assertIsInstance(err["message"], str)
        self.assertTrue(err["message"])
        self.assertIsInstance(err["type"], str)
        self.assertIn("param", err)
        self.assertIn("code", err)

    def test_zz_still_serves_and_every_page_is_free(self):
        r = self.complete("after everything", max_tokens=8)
        self.assertEqual(r.choices[0].finish_reason in ("stop", "length"), True)
        self.assertTrue(wait_until(lambda: self.server.metrics()["fp4moe_num_running_requests"] == 0, 5))
        status, _, _ = self.server.request("POST", "/flush_cache", {})
        self.assertEqual(status, 200)
        m = self.server.metrics()
        self.assertEqual(m["fp4moe_kv_pages_used"], 0)
        self.assertEqual(m["fp4moe_kv_pages_cached"], 0)
        self.assertEqual(m["fp4moe_kv_pages_free"], m["fp4moe_kv_pages_total"])
        self.assertGreater(m["fp4moe_time_to_first_token_seconds_count"], 0)
        self.assertGreater(m["fp4moe_inter_token_latency_seconds_count"], 0)
        self.assertGreater(m["fp4moe_e2e_request_latency_seconds_count"], 0)
        self.assertGreater(m["fp4moe_moe_expert_tokens_count"], 0)
        self.assertEqual(m["fp4moe_healthy"], 1)


class FolderServer(unittest.TestCase):
    """A server over a model folder made in a temporary directory (make_folder fills it)."""
    SERVER_ARGS = ()
    BACKEND = "fake"

    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text", "data")
        cls.dir = tempfile.mkdtemp(prefix="fp4moe_serve_")
        cls.make_folder()
        cls.server = ServerProcess("--model", cls.dir, *cls.SERVER_ARGS, backend=cls.BACKEND)
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        import shutil
        rc = cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)
        assert rc == 0, f"server exit code {rc}"


class RealTokenizer(FolderServer):
    """The fake model behind a real tokenizer folder (text/: tokenizer.json BPE, chat template)."""
    SERVER_ARGS = ("--fake-eos-period", "0")

    @classmethod
    def make_folder(cls):
        import shutil
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(os.path.join(cls.data, "glm_style", f), cls.dir)
        shutil.copy(os.path.join(cls.data, "templates", "glm_style.jinja"), os.path.join(cls.dir, "chat_template.jinja"))

    def test_chat_and_tokenize_through_the_real_tokenizer(self):
        name = os.path.basename(self.dir)
        self.assertEqual([m.id for m in self.client.models.list().data], [name])
        msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Hello, world! \u00e9\u4e2d"}]
        status, tok = self.server.json("POST", "/tokenize", {"messages": msgs})
        self.assertEqual(status, 200)
        status, detok = self.server.json("POST", "/detokenize", {"tokens": tok["tokens"]})
        self.assertIn("<|user|>", detok["text"])
        self.assertIn("Hello, world! \u00e9\u4e2d", detok["text"])
        r = self.client.chat.completions.create(model=name, messages=msgs, max_tokens=40, temperature=0)
        self.assertEqual(r.usage.prompt_tokens, tok["count"])
        self.assertEqual(r.usage.completion_tokens, 40)
        streamed = "".join(c.choices[0].delta.content or "" for c in self.client.chat.completions.create(
            model=name, messages=msgs, max_tokens=40, temperature=0, stream=True) if c.choices)
        self.assertEqual(streamed, r.choices[0].message.content)
        status, g = self.server.json("POST", "/generate", {"input_ids": tok["tokens"], "sampling_params": {
            "max_new_tokens": 40, "temperature": 0}})
        status, d = self.server.json("POST", "/detokenize", {"tokens": g["output_ids"]})
        self.assertEqual(g["text"], d["text"])
        status, t = self.server.json("POST", "/tokenize", {"prompt": "Hello, world!"})
        status, back = self.server.json("POST", "/detokenize", {"tokens": t["tokens"]})
        self.assertEqual(back["text"], "Hello, world!")
        # glm_style is byte-level BPE without a normalizer: a prompt whose bytes cannot fit is
        # refused before it is encoded, with the bound in the message.
        status, err = self.server.json("POST", "/v1/completions", {"prompt": "Hello, world! " * 300000})
        self.assertEqual(status, 400)
        self.assertEqual(err["error"]["code"], "context_length_exceeded")
        self.assertIn("bytes are at least", err["error"]["message"])

    def test_a_missing_model_folder_is_one_line_and_exit_1(self):
        p = subprocess.run([BINARY, "serve", "--backend", "fake", "--model", "/nonexistent/dir", "--port",
                            str(free_port())], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("tokenizer.json", p.stderr)


# A chat template that renders tools, tool calls (arguments as an object, GLM-style) and tool
# results, and `enable_thinking` from chat_template_kwargs; render_like_template is the same
# in Python (transformers' tojson is json.dumps with ensure_ascii=False).
TOOLS_TEMPLATE = (
    "{%- if tools -%}<|system|>Tools:{%- for t in tools -%}{{ '\\n' }}{{ t.function.name }}={{ t | tojson }}"
    "{%- endfor -%}{%- endif -%}"
    "{%- for m in messages -%}<|{{ m.role }}|>{%- if m.role == 'tool' -%}[{{ m.tool_call_id }}]{%- endif -%}"
    "{{ m.content }}{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}<tool_call>{{ c.function.name }}"
    "{%- for k, v in c.function.arguments.items() -%}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson }}"
    "</arg_value>{%- endfor -%}</tool_call>{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}<think></think>{%- endif -%}{%- endif -%}")


def render_like_template(messages, tools=None, add_generation_prompt=True, kwargs=None):
    out = ""
    if tools:
        out += "<|system|>Tools:" + "".join("\n" + t["function"]["name"] + "=" + json.dumps(t, ensure_ascii=False)
                                           for t in tools)
    for m in messages:
        out += "<|%s|>" % m["role"]
        if m["role"] == "tool":
            out += "[%s]" % m["tool_call_id"]
        out += m.get("content") or ""
        for c in m.get("tool_calls") or []:
            args = c["function"]["arguments"]
            args = json.loads(args) if isinstance(args, str) else args
            out += "<tool_call>" + c["function"]["name"] + "".join(
                "<arg_key>%s</arg_key><arg_value>%s</arg_value>" % (k, json.dumps(v, ensure_ascii=False))
                for k, v in args.items()) + "</tool_call>"
    if add_generation_prompt:
        out += "<|assistant|>"
        if (kwargs or {}).get("enable_thinking") is False:
            out += "<think></think>"
    return out


class CpuModel(FolderServer):
    """--backend cpu on a random GLM-5-architecture toy model (make-synthetic glm5-tiny) with a
    small trained tokenizer: the same tokens as `fp4moe generate`."""
    SERVER_ARGS = ("--kv-cache-dtype", "f32", "--page-size", "4", "--max-running-requests", "8",
                   "--num-continuous-decode-steps", "2")
    BACKEND = "cpu"

    @classmethod
    def make_folder(cls):
        import shutil
        subprocess.run([BINARY, "make-synthetic", cls.dir, "--preset", "glm5-tiny"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        shutil.copy(os.path.join(cls.data, "behaviors", "tokenizer.json"), cls.dir)  # 801 ids <= the model's 1024
        with open(os.path.join(cls.dir, "chat_template.jinja"), "w") as f:
            f.write(TOOLS_TEMPLATE)

    def generate_cli(self, ids, n, *extra):
        p = subprocess.run([BINARY, "generate", "--model", self.dir, "--prompt-ids", ",".join(map(str, ids)),
                            "--max-new-tokens", str(n), "--kv-dtype", "f32", "--page-size", "4", *extra],
                           capture_output=True, text=True, timeout=300, check=True)
        return [int(x) for x in p.stdout.splitlines()[0].split(",")]

    def test_same_tokens_as_generate(self):
        ids = [5, 17, 300, 42, 7, 99, 640, 3]
        status, g = self.server.json("POST", "/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": 10, "temperature": 0}})
        self.assertEqual(status, 200)
        self.assertEqual(g["output_ids"], self.generate_cli(ids, 10))
        status, g = self.server.json("POST", "/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": 10, "temperature": 0.8, "sampling_seed": 7}})
        self.assertEqual(g["output_ids"], self.generate_cli(ids, 10, "--temperature", "0.8", "--seed", "7"))

    def test_chat_and_concurrent_streams(self):
        name = os.path.basename(self.dir)
        msgs = [{"role": "user", "content": "Hello there"}]
        r = self.client.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 8)

        def run(i):
            toks = 0
            for chunk in self.client.completions.create(model=name, prompt=f"story {i}", max_tokens=6, stream=True,
                                                        temperature=0.5, seed=i,
                                                        stream_options={"include_usage": True}):
                if chunk.usage:
                    toks = chunk.usage.completion_tokens
            return toks

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            self.assertEqual(list(pool.map(run, range(4))), [6] * 4)
        status, info = self.server.json("GET", "/get_server_info")
        self.assertGreater(info["memory_plan"]["kv_bytes_per_token"], 0)
        self.assertGreater(info["memory_plan"]["weight_bytes"], 0)


    def test_tools_and_a_tool_follow_up_are_rendered_by_the_template(self):
        name = os.path.basename(self.dir)
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]

        def rendered(body):
            """What the server renders for a chat body: /tokenize, then /detokenize."""
            status, tok = self.server.json("POST", "/tokenize", body)
            self.assertEqual(status, 200, tok)
            status, detok = self.server.json("POST", "/detokenize", {"tokens": tok["tokens"]})
            return tok["count"], detok["text"]

        def expect(text):
            # The test tokenizer (tests/text/data/behaviors) drops ,.!?;: in its pre-tokenizer.
            return re.sub(r"[,.!?;:]", "", text)

        msgs = [{"role": "user", "content": "Weather in Paris, \u00e9t\u00e9?"}]
        r = self.client.chat.completions.create(model=name, messages=msgs, tools=tools, max_tokens=4, temperature=0)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        count, text = rendered({"messages": msgs, "tools": tools})
        self.assertEqual(text, expect(render_like_template(msgs, tools)))
        self.assertIn("get_weather", text)
        self.assertEqual(r.usage.prompt_tokens, count)
        # tool_choice "none": the tools are not rendered (SGLang's rule).
        r = self.client.chat.completions.create(model=name, messages=msgs, tools=tools, tool_choice="none",
                                                max_tokens=4, temperature=0)
        count_none, text_none = rendered({"messages": msgs, "tools": tools, "tool_choice": "none"})
        self.assertEqual(text_none, expect(render_like_template(msgs)))
        self.assertEqual(r.usage.prompt_tokens, count_none)
        # The follow-up: the assistant's call (arguments as a JSON string, as the client sends them) and the result.
        follow = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny 21 C"}]
        kwargs = {"enable_thinking": False}
        r = self.client.chat.completions.create(model=name, messages=follow, tools=tools, max_tokens=4, temperature=0,
                                                extra_body={"chat_template_kwargs": kwargs})
        count, text = rendered({"messages": follow, "tools": tools, "chat_template_kwargs": kwargs})
        self.assertEqual(text, expect(render_like_template(follow, tools, kwargs=kwargs)))
        self.assertIn("<tool_call>get_weather<arg_key>city</arg_key><arg_value>\"Paris\"</arg_value>", text)
        self.assertIn("<|tool|>[call_1]sunny 21 C", text)
        self.assertTrue(text.endswith("<|assistant|><think></think>"), text)
        self.assertEqual(r.usage.prompt_tokens, count)
        # Streaming takes the same fields.
        chunks = list(self.client.chat.completions.create(model=name, messages=follow, tools=tools, max_tokens=3,
                                                          temperature=0, stream=True,
                                                          stream_options={"include_usage": True},
                                                          extra_body={"chat_template_kwargs": kwargs}))
        self.assertEqual(chunks[-1].usage.prompt_tokens, count)
        # Refused with a 400 naming the field; the server stays healthy.
        bad = [
            # (this server has no --tool-call-parser: the format to hold the output to is unknown)
            (dict(tools=tools, tool_choice="required"), "tool_choice", "--tool-call-parser"),
            (dict(tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}), "tool_choice",
             "--tool-call-parser"),
            (dict(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice",
             "not in 'tools'"),
            (dict(extra_body={"tools": {"type": "function"}}), "tools", "array"),
            (dict(extra_body={"tools": [{"type": "function", "function": {"description": "x"}}]}),
             "tools[0].function.name", "required"),
            (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}),
             "response_format.json_schema.schema", "unsupported JSON schema keyword 'not'"),
        ]
        for kw, param, says in bad:
            with self.subTest(param=param, says=says):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.client.chat.completions.create(model=name, messages=msgs, max_tokens=2, **kw)
                self.assertEqual(cm.exception.body["param"], param)
                self.assertIn(says, cm.exception.body["message"])
        # Structured output through the CPU model and its real BPE tokenizer (issue 42): masked
        # greedy decoding gives text inside the grammar, ended by the tokenizer's EOS.
        r = self.client.chat.completions.create(model=name, messages=msgs, max_tokens=12, temperature=0,
                                                extra_body={"regex": "(yes|no|maybe)"})
        self.assertIn(r.choices[0].message.content, ("yes", "no", "maybe"))
        self.assertEqual(r.choices[0].finish_reason, "stop")
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22, 333]}},
                  "required": ["ok", "n"], "additionalProperties": False}
        r = self.client.chat.completions.create(
            model=name, messages=msgs, max_tokens=40, temperature=0.8, seed=5,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        got = json.loads(r.choices[0].message.content)
        self.assertIsInstance(got["ok"], bool)
        self.assertIn(got["n"], (1, 22, 333))
        self.assertEqual(set(got), {"ok", "n"})
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model=name, max_tokens=2, messages=msgs + [
                {"role": "tool", "content": "orphan result"}])
        self.assertEqual(cm.exception.body["param"], "messages[1].tool_call_id")
        self.assertEqual(self.server.request("GET", "/health")[0], 200)

    def test_memory_goes_back_after_a_large_prompt(self):
        """Issue 37 item 9: an 8 MiB prompt (over the context; this tokenizer has no byte bound, so it is
        encoded) leaves the server's RSS near where it was: the tokenizer's per-thread buffers are
        released and the heap is trimmed 1 s after the request."""
        def rss_mb():
            with open(f"/proc/{self.server.proc.pid}/status") as f:
                return int([line.split()[1] for line in f if line.startswith("VmRSS")][0]) / 1024
        self.server.request("POST", "/v1/completions", {"prompt": "warm up", "max_tokens": 2})
        time.sleep(1.5)
        before = rss_mb()
        status, data, _ = self.server.request("POST", "/v1/completions", {"prompt": "word " * (8 << 18)}, timeout=120)
        self.assertEqual(status, 400, data[:200])
        self.assertEqual(json.loads(data)["error"]["code"], "context_length_exceeded")
        time.sleep(2.5)
        after = rss_mb()
        print(f"RSS {before:.0f} MB before an 8 MiB prompt, {after:.0f} MB 2.5 s after", file=sys.stderr)
        # Measured on the 2-core CI-like machine: +0 MB; at e7ea5a5 (buffers kept per HTTP
        # thread, no trim) +191 MB. 40 MB leaves room for allocator slack without letting that through.
        self.assertLess(after - before, 40)

    def test_metrics_count_every_routed_token_and_the_step_batches(self):
        name = os.path.basename(self.dir)
        self.client.completions.create(model=name, prompt="count the experts", max_tokens=5, temperature=0)
        with open(os.path.join(self.dir, "config.json")) as f:
            cfg = json.load(f)
        moe_layers = cfg["num_hidden_layers"] - cfg.get("first_k_dense_replace", 0)
        m = self.server.metrics()
        tokens = m["fp4moe_step_batch_tokens_sum"]
        self.assertGreater(tokens, 0)
        self.assertGreaterEqual(m["fp4moe_step_batch_tokens_count"], 5)
        self.assertEqual(m["fp4moe_moe_gemms_total"], moe_layers * m["fp4moe_step_batch_tokens_count"])
        self.assertEqual(m["fp4moe_moe_expert_tokens_sum"], tokens * cfg["num_experts_per_tok"] * moe_layers)
        self.assertEqual(m["fp4moe_moe_expert_tokens_count"], m["fp4moe_moe_gemms_total"] * cfg["n_routed_experts"])
        self.assertAlmostEqual(m["fp4moe_moe_tokens_per_expert_mean"],
                               m["fp4moe_moe_expert_tokens_sum"] / m["fp4moe_moe_expert_tokens_count"], places=6)
        self.assertGreaterEqual(m["fp4moe_moe_tokens_per_active_expert_mean"], m["fp4moe_moe_tokens_per_expert_mean"])


    # The cases below are the fake-backend suite's client checks restated for a real model (no
    # byte-per-token shortcuts), so that --backend cuda runs them too (CudaModel inherits them).
    EXTRA_ARGS = ("--kv-cache-dtype", "f32")  # of any second server a case starts

    def complete(self, p, n_tokens, **kw):
        return self.client.completions.create(model=os.path.basename(self.dir), prompt=p, max_tokens=n_tokens,
                                              temperature=kw.pop("temperature", 0), extra_body={"ignore_eos": True},
                                              **kw)

    def test_logprobs_and_the_greedy_paths_agree(self):
        name, msgs = os.path.basename(self.dir), [{"role": "user", "content": "log probs"}]
        r = self.client.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                                top_logprobs=3, extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 8)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)  # greedy: the sampled is the best
        # Without logprobs a greedy batch takes the backend's argmax-only path: the same tokens.
        plain = self.client.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0,
                                                    extra_body={"ignore_eos": True})
        self.assertEqual(plain.choices[0].message.content, r.choices[0].message.content)

    def test_n_2_samples_two_choices(self):
        r = self.complete("two choices", 16, n=2, temperature=1.0, seed=5)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        self.assertEqual(r.usage.completion_tokens, 32)
        self.assertNotEqual(r.choices[0].text, r.choices[1].text)

    def test_64_concurrent_streams_each_get_their_own_greedy_output(self):
        name = os.path.basename(self.dir)
        prompts = [f"client {i} says" for i in range(64)]
        expected = [self.complete(p, 8).choices[0].text for p in prompts]
        start = threading.Barrier(len(prompts))

        def run(p):
            start.wait()
            out = ""
            for chunk in self.client.completions.create(model=name, prompt=p, max_tokens=8, temperature=0, stream=True,
                                                        extra_body={"ignore_eos": True}):
                out += "".join(c.text for c in chunk.choices)
            return out

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            self.assertEqual(list(pool.map(run, prompts)), expected)

    def test_prefix_reuse_keeps_greedy_outputs(self):
        long_prompt = "a long shared system prompt for reuse " * 6
        cold = self.complete(long_prompt + "first", 12)
        warm = self.complete(long_prompt + "first", 12)
        self.assertGreater(warm.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(warm.choices[0].text, cold.choices[0].text)

    def test_a_closed_stream_is_aborted_and_frees_its_pages(self):
        aborted = 'fp4moe_request_finished_total{finished_reason="abort"}'
        before = self.server.metrics()[aborted]
        stream = self.client.completions.create(model=os.path.basename(self.dir), prompt="long", max_tokens=500,
                                                stream=True, extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        self.assertTrue(wait_until(lambda: self.server.metrics()[aborted] >= before + 1, 10), "not aborted")
        self.assertTrue(wait_until(lambda: self.server.metrics()["fp4moe_num_running_requests"] == 0, 10))
        self.server.request("POST", "/flush_cache", {})
        self.assertEqual(self.server.metrics()["fp4moe_kv_pages_used"], 0)

    def test_retraction_keeps_greedy_outputs(self):
        specs = [(f"retract {i}", 24 + i) for i in range(6)]
        expected = [self.complete(p, n).choices[0].text for p, n in specs]
        tiny = ServerProcess("--model", self.dir, "--max-total-tokens", "96", "--page-size", "4",
                             "--max-running-requests", "6", "--chunked-prefill-size", "16",
                             "--num-continuous-decode-steps", "2", *self.EXTRA_ARGS, backend=self.BACKEND)
        try:
            client, name = tiny.client(), os.path.basename(self.dir)

            def run(spec):
                out = ""
                for chunk in client.completions.create(model=name, prompt=spec[0], max_tokens=spec[1], temperature=0,
                                                       stream=True, extra_body={"ignore_eos": True}):
                    out += "".join(c.text for c in chunk.choices)
                return out

            with concurrent.futures.ThreadPoolExecutor(len(specs)) as pool:
                self.assertEqual(list(pool.map(run, specs)), expected)
            m = tiny.metrics()
            self.assertGreater(m["fp4moe_retractions_total"], 0)
            self.assertEqual(m["fp4moe_num_running_requests"], 0)
        finally:
            self.assertEqual(tiny.stop(), 0)


class CudaModel(CpuModel):
    """--backend cuda (the GPU runner behind the engine) on the same toy GLM-5 and tokenizer: the
    same tokens as `fp4moe generate --backend cuda`, chat, concurrent streams, the routed-token
    metrics from the device, and a batch of concurrent greedy requests each equal to its own
    output alone. Runs where FP4MOE_E2E_CUDA=1 (the device step tools/device/steps/60_serve.sh)."""
    SERVER_ARGS = ("--page-size", "4", "--max-running-requests", "8", "--num-continuous-decode-steps", "2",
                   "--max-total-tokens", "16384", "--context-length", "1024")
    BACKEND = "cuda"
    EXTRA_ARGS = ("--context-length", "1024")

    @classmethod
    def setUpClass(cls):
        if os.environ.get("FP4MOE_E2E_CUDA") != "1":
            raise unittest.SkipTest("--backend cuda needs a GPU (FP4MOE_E2E_CUDA=1)")
        super().setUpClass()

    def generate_cli(self, ids, n, *extra):
        p = subprocess.run([BINARY, "generate", "--model", self.dir, "--prompt-ids", ",".join(map(str, ids)),
                            "--max-new-tokens", str(n), "--backend", "cuda", "--page-size", "4", *extra],
                           capture_output=True, text=True, timeout=300, check=True)
        return [int(x) for x in p.stdout.splitlines()[0].split(",")]

    def test_concurrent_greedy_requests_each_equal_their_output_alone(self):
        specs = [([(7 * i + j) % 800 + 1 for j in range(3 + 5 * i)], 12 + i) for i in range(8)]

        def one(spec):
            ids, n = spec
            status, g = self.server.json("POST", "/generate", {"input_ids": ids, "sampling_params": {
                "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
            self.assertEqual(status, 200)
            return g["output_ids"]

        alone = [one(s) for s in specs]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(one, specs))
        self.assertEqual(together, alone)
        self.assertEqual([len(a) for a in alone], [n for _, n in specs])


class TinyKvPool(unittest.TestCase):
    """A 128-token KV pool: concurrent requests cannot all fit, the newest are retracted."""

    def test_retraction_keeps_outputs(self):
        ref = ServerProcess()
        try:
            specs = [(prompt(i), 40 + i) for i in range(8)]
            expected = []
            for p, n in specs:
                r = ref.client().completions.create(model="fake", prompt=p, max_tokens=n, temperature=0.7, seed=11,
                                                    extra_body={"ignore_eos": True})
                expected.append(r.choices[0].text)
        finally:
            self.assertEqual(ref.stop(), 0)
        tiny = ServerProcess("--max-total-tokens", "128", "--page-size", "4", "--max-running-requests", "8",
                             "--chunked-prefill-size", "16", "--num-continuous-decode-steps", "2",
                             "--fake-step-delay-us", "300")
        try:
            client = tiny.client()

            def run(i):
                p, n = specs[i]
                out = ""
                for chunk in client.completions.create(model="fake", prompt=p, max_tokens=n, temperature=0.7, seed=11,
                                                       stream=True, extra_body={"ignore_eos": True}):
                    out += "".join(c.text for c in chunk.choices)
                return out

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                got = list(pool.map(run, range(8)))
            self.assertEqual(got, expected)
            m = tiny.metrics()
            self.assertGreater(m["fp4moe_retractions_total"], 0)
            self.assertEqual(m["fp4moe_kv_pages_used"], 0)
            self.assertEqual(m["fp4moe_kv_pages_total"], 32)
            # A request longer than the pool is refused with the lengths.
            status, data, _ = tiny.request("POST", "/v1/completions", {"prompt": "abc", "max_tokens": 126})
            self.assertEqual(status, 400)
            self.assertIn("128", json.loads(data)["error"]["message"])
        finally:
            self.assertEqual(tiny.stop(), 0)


class Lifecycle(unittest.TestCase):
    """Loading (503), a full queue (429), a slow client, SIGTERM with requests in flight (exit 0), a
    backend failure (503 after it)."""

    def test_lifecycle(self):
        s = ServerProcess("--fake-load-delay-ms", "1500", "--max-running-requests", "1", "--max-queued-requests", "1",
                          "--fake-step-delay-us", "20000", "--http-request-timeout", "2",
                          "--graceful-shutdown-timeout", "1", wait_ready=False)
        try:
            # 503 while loading (the port is bound before the model loads).
            self.assertTrue(wait_until(lambda: self._status(s, "/health") is not None, 10))
            self.assertEqual(self._status(s, "/health"), 503)
            status, data, _ = s.request("POST", "/v1/completions", {"prompt": "a"})
            self.assertEqual(status, 503)
            self.assertEqual(json.loads(data)["error"]["type"], "server_error")
            s.wait_health(200)

            # One running, one queued, the third is refused.
            client = s.client()
            results = {}

            def stream(i):
                finish, text = None, ""
                try:
                    for chunk in client.completions.create(model="fake", prompt=f"q{i}", max_tokens=400, stream=True,
                                                           extra_body={"ignore_eos": True}):
                        for c in chunk.choices:
                            text += c.text
                            finish = c.finish_reason or finish
                except Exception as e:  # noqa: BLE001 - recorded and asserted below
                    finish = repr(e)
                results[i] = finish

            threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
            threads[0].start()
            self.assertTrue(wait_until(lambda: s.metrics()["fp4moe_num_running_requests"] == 1, 5))
            threads[1].start()
            self.assertTrue(wait_until(lambda: s.metrics()["fp4moe_num_queued_requests"] == 1, 5))
            status, data, _ = s.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(status, 429)
            self.assertEqual(json.loads(data)["error"]["code"], "queue_full")

            # A client trickling its headers is dropped after --http-request-timeout, engine untouched.
            slow = socket.create_connection(("127.0.0.1", s.port))
            slow.settimeout(10)
            t0 = time.time()
            closed = False
            for ch in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                try:
                    slow.send(bytes([ch]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.25)
                try:
                    slow.recv(4096, socket.MSG_DONTWAIT)  # a response or EOF: the server dropped it
                    closed = True
                    break
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
                    break
                if time.time() - t0 > 8:
                    break
            if not closed:
                try:
                    data = slow.recv(4096)
                    closed = data == b"" or data.startswith(b"HTTP/1.1 4")
                except OSError:
                    closed = True
            elapsed = time.time() - t0
            slow.close()
            self.assertTrue(closed)
            self.assertLess(elapsed, 6.0, "the slow client was not dropped in time")
            self.assertEqual(s.metrics()["fp4moe_num_running_requests"], 1)

            # SIGTERM: stop accepting, abort what is left after the timeout, exit 0.
            s.proc.send_signal(signal.SIGTERM)
            rc = s.proc.wait(20)
            for t in threads:
                t.join(10)
            self.assertEqual(rc, 0)
            self.assertEqual(results.get(0), "abort")
            self.assertEqual(results.get(1), "abort")
        finally:
            s.stop(signal.SIGKILL)

    def test_a_backend_failure_aborts_and_health_turns_503(self):
        s = ServerProcess("--fake-fail-after-steps", "4")
        try:
            r = s.client().completions.create(model="fake", prompt="abc", max_tokens=20, extra_body={"ignore_eos": True})
            self.assertEqual(r.choices[0].finish_reason, "abort")
            self.assertEqual(self._status(s, "/health"), 503)
            self.assertEqual(self._status(s, "/health_generate"), 503)
            status, data, ctype = s.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(status, 503)
            self.assertEqual(json.loads(data)["error"]["type"], "server_error")
            self.assertEqual(s.metrics()["fp4moe_healthy"], 0)
        finally:
            self.assertEqual(s.stop(), 0)

    @staticmethod
    def _status(s, path):
        try:
            return s.request("GET", path, timeout=2)[0]
        except OSError:
            return None


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        print("usage: openai_e2e_test.py PATH/TO/fp4moe [unittest args]")
        sys.exit(2)
    BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
