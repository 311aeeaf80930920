#!/usr/bin/env python3
"""Output tokens/s through `fp4moe serve` at several concurrencies (a benchmark, not a test).

    bench/serve_throughput.py PATH/TO/fp4moe [--backend fake] [--model DIR] [--tokens 256]
                              [--concurrency 1,16,64] [--requests-per-client 4] [extra serve flags after --]

Each client sends completions (ignore_eos, greedy, max_tokens = --tokens) back to back over
plain http.client, streaming (SSE, one event per token) and not. With --backend fake the model
costs ~nothing, so the rate is the HTTP + scheduler path's own ceiling; its inverse is the
per-token overhead to compare against `fp4moe generate` once the model runs.
"""
import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(port, prompt, tokens, stream):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": stream,
                       "stream_options": {"include_usage": True}})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if stream:
        got = 0
        for line in r:
            if line.startswith(b"data: {") and b'"usage":{' in line:
                got = json.loads(line[6:])["usage"]["completion_tokens"]
    else:
        got = json.loads(r.read())["usage"]["completion_tokens"]
    conn.close()
    return got


def run(port, concurrency, per_client, tokens, stream):
    total = [0]
    lock = threading.Lock()

    def client(i):
        for k in range(per_client):
            n = one(port, f"client {i} request {k}", tokens, stream)
            with lock:
                total[0] += n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total[0], time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--backend", default="fake")
    ap.add_argument("--model", default="")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests-per-client", type=int, default=4)
    args, extra = ap.parse_known_args()
    port = free_port()
    cmd = [args.binary, "serve", "--backend", args.backend, "--port", str(port), "--decode-log-interval", "0"]
    if args.model:
        cmd += ["--model", args.model]
    cmd += [a for a in extra if a != "--"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        one(port, "warm-up", args.tokens, False)  # first-touch of the KV pool, thread pools
        print(f"| concurrency | mode | output tokens | seconds | output tok/s | us per token |")
        print(f"| ---: | --- | ---: | ---: | ---: | ---: |")
        for c in [int(x) for x in args.concurrency.split(",")]:
            for stream in (False, True):
                n, dt = run(port, c, args.requests_per_client, args.tokens, stream)
                print(f"| {c} | {'stream' if stream else 'whole'} | {n} | {dt:.2f} | {n / dt:.0f} | {1e6 * dt / n:.1f} |")
    finally:
        proc.terminate()
        proc.wait(20)


if __name__ == "__main__":
    sys.exit(main())
