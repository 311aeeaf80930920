#!/usr/bin/env python3
"""A bounded load-and-fault soak of `fp4moe serve --backend cpu` on the tiny synthetic model
(issue 37), 127.0.0.1 only, Python's standard library only.

Usage: soak_test.py PATH/TO/fp4moe

1. Load: CLIENTS (64) concurrent clients, each ROUNDS (3) streamed completions with random prompt
   lengths and max_tokens; about a fifth disconnect mid-stream, a tenth read slowly (small
   receive buffer, pauses), and a few malformed requests (framing desync, duplicate
   Content-Length, header flood, bad JSON) are mixed in.
2. Asserts: every request ends as designed (complete streams end with [DONE] and a finish
   reason; disconnects are the client's; malformed requests get one 4xx and a close), the KV
   pages in use return to 0 (/metrics), the RSS after the load is within RSS_MARGIN of the
   level after warm-up (the margin: the KV pool, touched lazily, + 64 MB), and later requests
   succeed.
3. SIGTERM during DRAIN_STREAMS active streams: every stream ends with [DONE] (finish_reason
   length or abort), the server exits 0 within its graceful timeout + the 2 s flush bound.
Prints the figures (requests, failures, peak and final RSS, drain time).
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from socket_util import free_port, recv_to_close  # noqa: E402

CLIENTS = 64
ROUNDS = 3
DRAIN_STREAMS = 32
# RSS after the load may exceed the warm level by at most the KV pool (allocated at start but
# touched page by page as the load first uses them) plus THREADS_MARGIN_MB: the worker threads
# the load started (up to 2 x 64 + 32, ~100 KiB of touched stack each: 16 MiB) and the malloc
# arenas glibc keeps for them (8 x cores at most, a few MiB each), with room. A leak of the
# per-request state (prompts, token lists, JSON, 64 KiB read buffers) grows with the requests
# and shows up against this bound over a couple of hundred requests only if it is large; the
# figures printed below let a reader compare runs.
THREADS_MARGIN_MB = 64
HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = "the of and to in is was for on that with as by at from his her an which or be are this had".split()


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def http(port, method, path, body=None, timeout=30.0):
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(head.encode() + b"\r\n" + data)
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/1.1 ") else 0
    return status, out.split(b"\r\n\r\n", 1)[-1]


def metrics(port):
    status, body = http(port, "GET", "/metrics")
    assert status == 200
    m = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m


def dechunk(raw):
    """The body of a chunked HTTP/1.1 response (raw = everything after the head)."""
    out, pos = b"", 0
    while True:
        end = raw.find(b"\r\n", pos)
        if end < 0:
            return out, False
        size = int(raw[pos:end], 16)
        if size == 0:
            return out, True
        out += raw[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []

    def add(self, kind, ok=True, why=""):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if not ok:
                self.failures.append(f"{kind}: {why}")


def stream(port, rng, behaviour, stats, max_tokens=None, ignore_eos=False):
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30 if max_tokens else 200)))
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens or rng.randint(4, 16), "stream": True,
                       "ignore_eos": ignore_eos, "temperature": rng.choice([0.0, 0.7])}).encode()
    s = socket.socket()
    if behaviour == "slow":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.settimeout(60)
    s.connect(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    raw = b""
    try:
        while True:
            b = s.recv(256 if behaviour == "slow" else 65536)
            if not b:
                break
            raw += b
            if behaviour == "slow":
                time.sleep(0.01)
            if behaviour == "disconnect" and raw.count(b"data: ") >= 2:
                s.close()  # mid-stream
                stats.add("disconnected")
                return None
    except OSError as e:
        stats.add("stream", False, f"socket: {e}")
        return None
    finally:
        s.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        stats.add("stream", False, head[:120])
        return None
    text, complete = dechunk(rest)
    events = [e[6:] for e in text.decode().split("\n\n") if e.startswith("data: ")]
    finishes = [json.loads(e)["choices"][0].get("finish_reason") for e in events[:-1] if e != "[DONE]"]
    finishes = [f for f in finishes if f]
    if behaviour == "disconnect":  # the stream ended before the client left: fine
        behaviour = "normal"
    if not complete or not events or events[-1] != "[DONE]" or len(finishes) != 1:
        stats.add(behaviour, False, f"incomplete stream ({len(events)} events, finishes {finishes})")
        return None
    stats.add(behaviour)
    return finishes[0]


MALFORMED = [
    ("desync", b"BAD\r\n" + b"x\r\n" * 2000),
    ("smuggle", b"XX\r\nGET /get_server_info HTTP/1.1\r\nHost: t\r\n\r\n"),
    ("two_lengths", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}"
                    b"GET /get_server_info HTTP/1.1\r\nHost: t\r\n\r\n"),
    ("header_flood", b"GET /v1/models HTTP/1.1\r\nHost: t\r\n" + b"X-Pad: " + b"p" * 200 + b"\r\n" * 1 +
     (b"X-Pad: " + b"p" * 200 + b"\r\n") * 400),
    ("bad_json", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 5\r\n\r\n{\"a\":"),
]


def malformed(port, name, data, stats):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        s.sendall(data)
    except OSError:
        pass  # the server refused early and closed: read what it said
    out = recv_to_close(s, tolerate=OSError)
    s.close()
    ok = out.startswith(b"HTTP/1.1 4") and out.count(b"HTTP/1.1 ") == 1
    stats.add("malformed", ok, f"{name}: {out[:120]!r}")


def main(binary):
    t_start = time.monotonic()
    work = tempfile.mkdtemp(prefix="fp4moe_soak_")
    model = os.path.join(work, "model")
    subprocess.run([binary, "make-synthetic", model, "--preset", "glm5-tiny"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    shutil.copy(os.path.join(HERE, "..", "text", "data", "behaviors", "tokenizer.json"), model)
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    proc = subprocess.Popen([binary, "serve", "--model", model, "--backend", "cpu", "--port", str(port),
                             "--max-running-requests", "64", "--decode-log-interval", "0",
                             "--graceful-shutdown-timeout", "3"], stdout=log, stderr=log)
    failures = []
    try:
        deadline = time.time() + 60
        while True:
            try:
                if http(port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "the server did not start"
            time.sleep(0.05)
        stats = Stats()
        rng = random.Random(37)
        for _ in range(8):  # warm-up: threads, arenas, the prefix cache
            stream(port, rng, "normal", stats)
        rss_warm = rss_mb(proc.pid)
        kv_mb = json.loads(http(port, "GET", "/get_server_info")[1])["memory_plan"]["kv_bytes"] / 2**20
        margin = kv_mb + THREADS_MARGIN_MB

        # 1. Load.
        peak = [rss_warm]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(proc.pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()

        def client(i):
            r = random.Random(1000 + i)
            for k in range(ROUNDS):
                if i < len(MALFORMED) and k == 1:
                    malformed(port, *MALFORMED[i], stats)
                    continue
                u = r.random()
                stream(port, r, "disconnect" if u < 0.2 else "slow" if u < 0.3 else "normal", stats)

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        load_s = time.monotonic() - t0

        # 2. Back to idle: no KV page in use, memory near the warm level, the server answers.
        idle_deadline = time.time() + 10
        while True:
            m = metrics(port)
            if (m["fp4moe_kv_pages_used"] == 0 and m["fp4moe_num_running_requests"] == 0) or time.time() > idle_deadline:
                break
            time.sleep(0.1)
        if m["fp4moe_kv_pages_used"] != 0 or m["fp4moe_num_running_requests"] != 0:
            failures.append(f"after the load: {m['fp4moe_kv_pages_used']} KV pages used, "
                            f"{m['fp4moe_num_running_requests']} running")
        time.sleep(0.5)
        done.set()
        sampler.join()
        rss_after = rss_mb(proc.pid)
        if rss_after > rss_warm + margin:
            failures.append(f"RSS after the load {rss_after:.0f} MB > warm {rss_warm:.0f} MB + {margin:.0f} MB")
        later = Stats()
        for _ in range(8):
            status, body = http(port, "POST", "/v1/completions", {"prompt": "hello there", "max_tokens": 8})
            later.add("later", status == 200 and json.loads(body)["usage"]["completion_tokens"] >= 1, status)
            later.add("later", stream(port, rng, "normal", later) is not None, "stream")
        failures += stats.failures + later.failures

        # 3. SIGTERM during active streams (each long enough to outlive the 3 s grace).
        drain = Stats()
        ends = []
        streams = [threading.Thread(target=lambda r=random.Random(i): ends.append(
            stream(port, r, "normal", drain, max_tokens=3000, ignore_eos=True))) for i in range(DRAIN_STREAMS)]
        for t in streams:
            t.start()
        started = time.time() + 20
        while metrics(port)["fp4moe_num_running_requests"] == 0 and time.time() < started:
            time.sleep(0.05)  # until the streams run
        time.sleep(0.5)
        running = metrics(port)["fp4moe_num_running_requests"]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        drain_s = time.monotonic() - t0
        for t in streams:
            t.join(10)
        failures += drain.failures
        if rc != 0:
            failures.append(f"exit code {rc} after SIGTERM")
        if drain_s > 3 + 2 + 2:  # the grace, the flush bound, and room
            failures.append(f"drain took {drain_s:.1f} s")
        if running == 0:
            failures.append("no stream was running at SIGTERM")
        if sorted(set(e for e in ends if e)) not in (["abort"], ["abort", "length"], ["length"]):
            failures.append(f"drained streams ended with {sorted(set(map(str, ends)))}")

        n = sum(stats.counts.values())
        print(f"soak: {CLIENTS} clients x {ROUNDS} rounds in {load_s:.1f} s: {n} requests "
              f"({', '.join(f'{k} {v}' for k, v in sorted(stats.counts.items()))}), "
              f"{len(stats.failures)} failures")
        print(f"soak: RSS warm {rss_warm:.0f} MB, peak {peak[0]:.0f} MB, after the load {rss_after:.0f} MB "
              f"(margin: KV pool {kv_mb:.0f} MB + {THREADS_MARGIN_MB} MB); later requests {sum(later.counts.values())} with "
              f"{len(later.failures)} failures")
        print(f"soak: SIGTERM with {running:.0f} streams running: exit {rc} after {drain_s:.2f} s; "
              f"stream ends {dict((str(e), ends.count(e)) for e in set(ends))}; total {time.monotonic() - t_start:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        if failures:
            with open(os.path.join(work, "serve.log")) as f:
                sys.stderr.write(f.read()[-3000:])
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1])))
