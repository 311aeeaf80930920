#!/usr/bin/env python3
"""Issue 17's sweep: output tok/s of `fp4moe serve` over --max-running-requests (cap) x
--num-continuous-decode-steps (K), and the PyTorch baseline (bench/torch_serve) beside it, all
measured with the same client (`fp4moe bench serve`, random ids, ignore_eos), inside a time budget.

    bench/serve_sweep.py --fp4moe build-dev/bin/fp4moe --model DIR --out DIR [--backend cuda]
        [--input-len 64] [--output-len 64] [--caps 16,64,256,1024,2048] [--steps 1,8,4,2]
        [--prompts-factor 2] [--min-prompts 64] [--max-prompts 1024] [--budget-s 450] [--deadline EPOCH]
        [--torch-caps 16,...] [--torch-steps 1] [--no-torch] [--serve-args "..."] [--torch-args "..."]

One server per K, started with the largest cap; each cell's cap is applied by the client's
--max-concurrency (so the server's running set never exceeds the cell's cap: the server never
queues; what differs from a server-side cap is only that a freed slot is refilled after the
client's next request arrives, one HTTP round trip, and that TTFT does not include time queued
in the server). Restarting the server per cell would cost ~20 s of load x 20 cells, more than
the whole budget. Order: fp4moe at the first K, the baseline, then fp4moe at the other Ks; in
each server caps ascending. A cell whose predicted time (from the token rate of the same cap at
an earlier K, else of the previous cell on this server: an over-estimate, rates grow with the
cap) does not fit what is left of
the budget is recorded as skipped with the reason; a cell that runs past the budget is killed
and recorded as such. Everything goes to --out: cells/<server>_K<k>_cap<c>.json (the bench serve
JSON line, /metrics before / after, the derived numbers), server logs, and summary.json,
rewritten after every cell. bench/serve_sweep_report.py turns summary.json into tables and plots.
Last, with what budget is left: `serve --backend fake` (a model that costs nothing) at the largest
cap: the HTTP + scheduler path's own ceiling in output tok/s on this host.

Per cell, from fp4moe's /metrics (differences of counters between the scrapes around the cell,
never the since-start gauges): tokens per expert per MoE GEMM = delta sum / delta count of the
fp4moe_moe_expert_tokens histogram (every expert of every GEMM, zeros included), per active
expert = delta sum / (delta count - delta of its le="0" bucket), the mean batch per model step
(fp4moe_step_batch_requests / _tokens), model steps, rounds, retractions, prefix-cache hits (~0: each cap has its own prompt seed); and, sampled every
0.2 s during the cell, the largest running set and KV use. The baseline reports its steps and
tokens (JSON /metrics), so its tokens per expert are its mean step tokens x top_k / experts.
"""
import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg):
    print(f"[sweep {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ints(s):
    return [int(x) for x in re.split(r"[,\s]+", s.strip()) if x]


def http_get(url, timeout=5.0):
    """(status, body text); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


# ---- a tokenizer for a synthetic model ------------------------------------------------------

def gpt2_byte_chars():
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def write_id_tokenizer(model_dir, vocab):
    """`make-synthetic` writes no tokenizer and `fp4moe serve` needs one: a byte-level BPE over the
    model's whole vocabulary (ids 0-255 the bytes, id N the text "tN", the last id <|endoftext|>,
    no merges), so every generated id has non-empty text and the client counts one chunk per
    token (a small test tokenizer would drop the ids it does not know: no text, no chunk)."""
    byte_chars = gpt2_byte_chars()
    v = {byte_chars[i]: i for i in range(256)}
    v.update({f"t{i}": i for i in range(256, vocab - 1)})
    eos = {"id": vocab - 1, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [eos], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": v, "merges": []}}
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}, f)


def gpu_memory_used():
    """nvidia-smi's memory.used of every GPU (MiB), or None without one."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


# ---- /metrics -------------------------------------------------------------------------------

PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def parse_prometheus(text):
    """{'name{labels}': value} for every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = PROM_LINE.match(line.strip())
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def scrape(kind, base):
    status, body = http_get(base + "/metrics")
    if status != 200:
        return None
    if kind == "torch":
        try:
            return {k: float(v) for k, v in json.loads(body).items() if isinstance(v, (int, float))}
        except ValueError:
            return None
    return parse_prometheus(body)


def ratio(a, b):
    return a / b if b else None


def metric_deltas(kind, m0, m1, top_k, experts):
    """What the server counted during the cell (None where a scrape failed)."""
    if not m0 or not m1:
        return {"error": "a /metrics scrape failed"}
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    if kind == "torch":
        steps, tokens = d("decode_steps"), d("decode_tokens")
        all_steps, all_tokens = steps + d("prefill_steps"), tokens + d("prefill_tokens")
        mean_step = ratio(all_tokens, all_steps)
        return {"decode_steps": steps, "prefill_steps": d("prefill_steps"), "decode_tokens": tokens,
                "prefill_tokens": d("prefill_tokens"), "forward_seconds": d("forward_seconds"),
                "steps": all_steps, "mean_decode_batch": ratio(tokens, steps), "mean_step_tokens": mean_step,
                "tokens_per_expert_mean": mean_step * top_k / experts if mean_step is not None else None,
                "tokens_per_expert_source": "step tokens (prefill + decode) x top_k / experts, as fp4moe's "
                                            "(the baseline does not count per expert)",
                "forward_ms_per_step": ratio(1000 * d("forward_seconds"), all_steps)}
    h = "fp4moe_moe_expert_tokens"
    gemms, slots, routed, zeros = d("fp4moe_moe_gemms_total"), d(h + "_count"), d(h + "_sum"), d(h + '_bucket{le="0"}')
    step_count, step_tokens = d("fp4moe_step_batch_tokens_count"), d("fp4moe_step_batch_tokens_sum")
    r = {"moe_gemms": gemms, "expert_slots": slots, "routed_tokens": routed,
         "tokens_per_expert_mean": ratio(routed, slots), "tokens_per_active_expert_mean": ratio(routed, slots - zeros),
         "tokens_per_expert_source": "fp4moe_moe_expert_tokens histogram (per-expert counts the backend reported)",
         "steps": d("fp4moe_engine_steps_total"), "rounds": d("fp4moe_engine_rounds_total"),
         "retractions": d("fp4moe_retractions_total"), "cached_prompt_tokens": d("fp4moe_engine_cached_tokens_total"), "generation_tokens": d("fp4moe_generation_tokens_total"),
         "prefill_computed_tokens": d("fp4moe_prefill_computed_tokens_total"),
         "mean_step_requests": ratio(d("fp4moe_step_batch_requests_sum"), d("fp4moe_step_batch_requests_count")),
         "mean_step_tokens": ratio(step_tokens, step_count)}
    # The engine thread's busy time and the backend calls inside it (servers since 2026-12-04):
    # busy - backend is the host work of the rounds (scheduling, handing events to HTTP threads).
    if "fp4moe_engine_busy_seconds_total" in m1:
        busy, backend = d("fp4moe_engine_busy_seconds_total"), d("fp4moe_engine_backend_seconds_total")
        r.update({"busy_seconds": busy, "backend_seconds": backend,
                  "host_share_measured": ratio(busy - backend, busy),
                  "host_us_per_round": ratio(1e6 * (busy - backend), r["rounds"])})
    # From the step sizes alone (every token goes to top_k of the experts): the same number when
    # the backend reports its counts; the only one when it does not (moe_gemms = 0).
    # Model steps by size (tokens), per histogram bucket: {upper bound: steps} (not cumulative).
    prefix, hist, prev = "fp4moe_step_batch_tokens_bucket{le=\"", {}, 0.0
    for key in sorted((k for k in m1 if k.startswith(prefix)), key=lambda k: float(k[len(prefix):-2])):
        cum = d(key)
        hist[key[len(prefix):-2]] = cum - prev
        prev = cum
    r["step_tokens_hist"] = hist
    r["tokens_per_expert_from_steps"] = ratio(step_tokens * top_k, step_count * experts) if step_count else None
    if slots and r["tokens_per_expert_from_steps"]:
        # Every token of a step goes to top_k experts in each MoE layer, so the backend's counts and
        # the scheduler's step sizes must give the same mean: a mismatch is a counting bug.
        r["per_expert_vs_steps"] = r["tokens_per_expert_mean"] / r["tokens_per_expert_from_steps"]
    if not slots:
        r["tokens_per_expert_mean"] = r["tokens_per_expert_from_steps"]
        r["tokens_per_expert_source"] = "step tokens x top_k / experts (the backend reported no per-expert counts)"
    return r


class Sampler(threading.Thread):
    """Polls /metrics every 0.2 s during a cell: the largest running set and KV use."""

    def __init__(self, kind, base):
        super().__init__(daemon=True)
        self.kind, self.base, self.stop, self.max_running, self.max_kv = kind, base, threading.Event(), 0, 0.0

    def run(self):
        while not self.stop.wait(0.2):
            m = scrape(self.kind, self.base)
            if not m:
                continue
            if self.kind == "torch":
                running = m.get("running", 0)
                kv = 1 - m.get("free_pages", 0) / m["pages"] if m.get("pages") else 0
            else:
                running, kv = m.get("fp4moe_num_running_requests", 0), m.get("fp4moe_kv_usage_ratio", 0)
            self.max_running, self.max_kv = max(self.max_running, int(running)), max(self.max_kv, kv)


# ---- servers --------------------------------------------------------------------------------

class ServerProc:
    def __init__(self, kind, cmd, log_path, port):
        self.kind, self.cmd, self.log_path, self.port = kind, cmd, log_path, port
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout):
        """Seconds to /health 200, or raises RuntimeError with the log's tail."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}: {self.tail()}")
            if http_get(self.base + "/health", timeout=2)[0] == 200:
                return time.time() - self.t0
            time.sleep(0.25)
        raise RuntimeError(f"/health not 200 within {timeout:.0f} s: {self.tail()}")

    def tail(self, n=3):
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(line.strip() for line in f.read().splitlines()[-n:])
        except OSError:
            return ""

    def startup_lines(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return [line.strip() for line in f if re.search(r"serving '|memory plan|loaded in|gpu runner|cuda graphs|"
                                                                  r"uploaded|layers \(", line)][:8]
        except OSError:
            return []

    def stop(self):
        """SIGTERM (fp4moe drains and exits 0), SIGKILL after 20 s; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


# ---- the sweep ------------------------------------------------------------------------------

class Sweep:
    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget_s
        if a.deadline:
            self.deadline = min(self.deadline, a.deadline)
        os.makedirs(os.path.join(a.out, "cells"), exist_ok=True)
        cfg = json.load(open(os.path.join(a.model, "config.json")))
        self.top_k = int(cfg.get("num_experts_per_tok", 8))
        self.experts = int(cfg.get("n_routed_experts", 256))
        layers = int(cfg.get("num_hidden_layers", 0))
        dense = int(cfg.get("first_k_dense_replace", 0))
        self.summary = {
            "what": "issue 17 serve sweep: fp4moe serve (cap x K) and the PyTorch baseline, fp4moe bench serve",
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0)),
            "budget_s": round(self.deadline - self.t0, 1),
            "model": {"dir": a.model, "layers": layers, "dense_layers": dense, "moe_layers": layers - dense,
                      "experts": self.experts, "top_k": self.top_k, "hidden": cfg.get("hidden_size"),
                      "vocab": cfg.get("vocab_size")},
            "workload": {"input_len": a.input_len, "output_len": a.output_len, "range_ratio": 1.0,
                         "prompts": f"max({a.min_prompts}, min({a.prompts_factor} x cap, max(cap, {a.max_prompts})))",
                         "seed": f"{a.seed} + cap", "ignore_eos": True, "request_rate": "inf",
                         "reduction": (f"{a.input_len} in / {a.output_len} out instead of the seed's 1024 / 1024; "
                                       if (a.input_len, a.output_len) != (1024, 1024) else "")
                                      + f"{a.prompts_factor} x cap prompts ({a.prompts_factor} waves; at least "
                                      f"{a.min_prompts}; one wave of cap prompts where {a.prompts_factor} x cap > "
                                      f"{a.max_prompts}), to fit the device budget"},
            "fp4moe": {"backend": a.backend, "caps": ints(a.caps), "steps": ints(a.steps),
                       "serve_args": a.serve_args, "server_cap": max(ints(a.caps)),
                       "cap_applied_by": "the client's --max-concurrency (one server per K at the largest cap)"},
            "torch": None if a.no_torch else {"caps": ints(a.torch_caps or a.caps), "steps": ints(a.torch_steps),
                                             "args": a.torch_args, "server_cap": max(ints(a.torch_caps or a.caps))},
            "env": a.env,
            "servers": [], "cells": [],
        }
        self.summary["tokenizer"] = "the model folder's"
        if not os.path.exists(os.path.join(a.model, "tokenizer.json")):
            write_id_tokenizer(a.model, int(cfg["vocab_size"]))
            self.summary["tokenizer"] = f"written by serve_sweep.py: byte-level BPE, {cfg['vocab_size']} ids, 'tN' texts"
        self.rates = {}  # (server, cap) -> total tokens/s measured

    def left(self):
        return self.deadline - time.time()

    def save(self):
        self.summary["elapsed_s"] = round(time.time() - self.t0, 1)
        tmp = os.path.join(self.a.out, "summary.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.summary, f, indent=1)
        os.replace(tmp, os.path.join(self.a.out, "summary.json"))

    def prompts_for(self, cap):
        """factor x cap prompts (factor waves), at least min_prompts; above max_prompts one wave
        (= cap: the running set must still reach the cap)."""
        return max(self.a.min_prompts, min(self.a.prompts_factor * cap, max(cap, self.a.max_prompts)))

    def record(self, cell):
        self.summary["cells"].append(cell)
        name = f"{cell['server']}_K{cell['steps']}_cap{cell['cap']}.json"
        with open(os.path.join(self.a.out, "cells", name), "w") as f:
            json.dump(cell, f, indent=1)
        self.save()

    def skip_all(self, server, k, caps, reason):
        for cap in caps:
            self.record({"server": server, "steps": k, "cap": cap, "status": "skipped", "reason": reason})

    def server_cmd(self, server, k, cap, port):
        a = self.a
        if server == "fake":  # the HTTP + scheduler path alone: a model that costs nothing
            return [a.fp4moe, "serve", "--model", a.model, "--backend", "fake", "--port", str(port), "--max-running-requests",
                    str(cap), "--num-continuous-decode-steps", str(k), "--fake-eos-period", "0",
                    "--decode-log-interval", "0", "--graceful-shutdown-timeout", "5"]
        if server == "fp4moe":
            extra = shlex.split(a.serve_args)
            for flag, value in (("--decode-log-interval", "200"), ("--graceful-shutdown-timeout", "5")):
                if flag not in extra:
                    extra += [flag, value]
            return [a.fp4moe, "serve", "--model", a.model, "--backend", a.backend, "--port", str(port),
                    "--max-running-requests", str(cap), "--num-continuous-decode-steps", str(k), *extra]
        return [sys.executable, os.path.join(HERE, "torch_serve", "serve.py"), "--model", a.model, "--port", str(port),
                "--max-running-requests", str(cap), "--num-continuous-decode-steps", str(k), *shlex.split(a.torch_args)]

    def bench(self, base, n, concurrency, timeout, out_file, seed):
        a = self.a
        cmd = [a.fp4moe, "bench", "serve", "--base-url", base, "--num-prompts", str(n), "--random-input-len",
               str(a.input_len), "--random-output-len", str(a.output_len), "--random-range-ratio", "1.0",
               "--max-concurrency", str(concurrency), "--seed", str(seed), "--warmup-requests", "0",
               "--disable-progress", "--output-file", out_file, "--timeout", str(max(1, int(timeout)))]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout))
            return p.returncode, p.stdout, p.stderr, False
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            return -9, out, err, True

    def run_server(self, server, k, caps):
        a = self.a
        start_est = {"fp4moe": a.start_est_s, "torch": a.torch_start_est_s}.get(server, 5.0)
        if self.left() < start_est + a.reserve_s:
            self.skip_all(server, k, caps, f"budget: {self.left():.0f} s left, a server start takes ~{start_est:.0f} s")
            return
        cap_max = max(caps)
        tag = f"{server}_K{k}"
        port = a.port or free_port()  # a fresh one per server: the last one's may still be in use
        srv = ServerProc(server, self.server_cmd(server, k, cap_max, port), os.path.join(a.out, f"server_{tag}.log"), port)
        info = {"server": server, "steps": k, "cap": cap_max, "cmd": " ".join(shlex.quote(c) for c in srv.cmd)}
        self.summary["servers"].append(info)
        log(f"start {tag}: {info['cmd']}")
        try:
            info["start_s"] = round(srv.wait_healthy(max(5.0, min(a.start_timeout_s, self.left() - a.reserve_s))), 1)
        except RuntimeError as e:
            info["error"] = str(e)
            log(f"{tag} did not start: {e}")
            info["exit_code"] = srv.stop()
            self.skip_all(server, k, caps, f"server did not start: {e}")
            return
        info["startup_lines"] = srv.startup_lines()
        status, body = http_get(srv.base + "/get_server_info")
        if status == 200:
            try:
                info["server_info"] = json.loads(body)
            except ValueError:
                pass
        info["gpu_memory_used"] = gpu_memory_used()
        log(f"{tag} healthy in {info['start_s']} s")
        # One request through the whole path before the first measured cell (bench serve's own
        # warm-up would fall inside the metrics window).
        rc, _, err, _ = self.bench(srv.base, 1, 1, min(120.0, self.left()), os.path.join(a.out, f"warmup_{tag}.jsonl"),
                                   a.seed + 999_999)
        if rc != 0:
            info["warmup_error"] = err.strip()[-500:]
        rate = None  # total tokens/s of the previous cell on this server
        for cap in sorted(caps):
            n = self.prompts_for(cap)
            cell = {"server": server, "steps": k, "cap": cap, "num_prompts": n, "input_len": a.input_len,
                    "output_len": a.output_len, "server_cap": cap_max}
            left = self.left() - a.reserve_s
            # The rate this cap ran at on the same server kind with another K, else the previous
            # cell's on this server (lower: rates grow with the cap, so the time is over-estimated).
            known = self.rates.get((server, cap)) or rate
            est = n * (a.input_len + a.output_len) / known if known else None
            if srv.proc.poll() is not None:
                self.record(dict(cell, status="skipped", reason=f"server exited with {srv.proc.returncode}"))
                continue
            if left < 5 or (est is not None and est > left):
                why = f", ~{est:.0f} s predicted at {known:.0f} tok/s" if est is not None else ""
                self.record(dict(cell, status="skipped", reason=f"budget: {max(left, 0):.0f} s left{why}"))
                continue
            out_file = os.path.join(a.out, "cells", f"{tag}_cap{cap}.jsonl")
            m0 = scrape(server, srv.base)
            sampler = Sampler(server, srv.base)
            sampler.start()
            t0 = time.time()
            # The prompts' seed depends on the cap only: both servers get the same prompts at a cap,
            # and no cell finds the previous cell's prompts in the prefix cache.
            cell["seed"] = a.seed + cap
            rc, stdout, stderr, killed = self.bench(srv.base, n, cap, left, out_file, cell["seed"])
            wall = time.time() - t0
            sampler.stop.set()
            sampler.join(3)
            m1 = scrape(server, srv.base)
            cell.update(wall_s=round(wall, 2), bench_rc=rc, max_running=sampler.max_running,
                        max_kv_usage=round(sampler.max_kv, 4), metrics=metric_deltas(server, m0, m1, self.top_k, self.experts))
            report = None
            try:
                with open(out_file) as f:
                    lines = f.read().splitlines()
                report = json.loads(lines[-1]) if lines else None
            except (OSError, ValueError):
                pass
            if killed:
                cell.update(status="killed", reason=f"ran past the budget ({left:.0f} s left at its start)")
            elif report is None:
                cell.update(status="failed", reason=f"bench serve rc={rc}: {stderr.strip()[-400:]}")
            else:
                bad = report.get("failed", 0) > 0 or report.get("completed", 0) != n
                cell.update(status="failed" if bad else "ok",
                            bench={k2: v for k2, v in report.items() if not isinstance(v, list) or k2 == "error_messages"})
                if bad:
                    cell["reason"] = f"{report.get('failed')} of {n} requests failed: {report.get('error_messages')}"
                dur = report.get("duration") or wall
                rate = (report.get("total_input_tokens", 0) + report.get("total_output_tokens", 0)) / dur if dur else None
                if rate and not bad:
                    self.rates[(server, cap)] = max(rate, self.rates.get((server, cap), 0.0))
            with open(os.path.join(a.out, "cells", f"{tag}_cap{cap}.metrics.txt"), "w") as f:
                json.dump({"before": m0, "after": m1}, f)
            log(f"{tag} cap {cap}: {cell['status']} in {wall:.1f} s"
                + (f", {cell['bench']['output_throughput']:.0f} output tok/s, tokens/expert "
                   f"{cell['metrics'].get('tokens_per_expert_mean')}" if cell.get("bench") else f" ({cell.get('reason')})"))
            self.record(cell)
        info["exit_code"] = srv.stop()
        info["log_tail"] = srv.tail(5)
        log(f"{tag} stopped (exit {info['exit_code']}), {self.left():.0f} s left")
        self.save()

    def run(self):
        a = self.a
        caps, steps = ints(a.caps), ints(a.steps)
        plan = [("fp4moe", steps[0], caps)]
        if not a.no_torch:
            plan += [("torch", k, ints(a.torch_caps or a.caps)) for k in ints(a.torch_steps)]
        plan += [("fp4moe", k, caps) for k in steps[1:]]
        if a.fake_ceiling:
            plan.append(("fake", 1, [max(caps)]))
        self.summary["order"] = [f"{s} K={k}" for s, k, _ in plan]
        self.save()
        for server, k, cs in plan:
            self.run_server(server, k, cs)
        self.save()
        ok = sum(c["status"] == "ok" for c in self.summary["cells"])
        log(f"done: {ok} of {len(self.summary['cells'])} cells ok in {time.time() - self.t0:.0f} s")
        return 0 if ok else 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fp4moe", required=True, help="the fp4moe binary (server and client)")
    p.add_argument("--model", required=True, help="checkpoint folder both servers load")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--backend", default="cuda", help="fp4moe serve --backend (cuda; cpu or fake to rehearse)")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--caps", default="16,64,256,1024,2048")
    p.add_argument("--steps", default="1,8,4,2", help="K values; the first runs before the baseline")
    p.add_argument("--prompts-factor", type=int, default=2, help="prompts per cell = factor x cap (waves)")
    p.add_argument("--min-prompts", type=int, default=64, help="prompts per cell at least")
    p.add_argument("--max-prompts", type=int, default=1024, help="above this, one wave: cap prompts")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=450.0, help="seconds for the whole sweep")
    p.add_argument("--deadline", type=float, default=0.0, help="absolute end (epoch seconds), if earlier")
    p.add_argument("--reserve-s", type=float, default=15.0, help="kept free at the end (stops, packing)")
    p.add_argument("--start-est-s", type=float, default=30.0, help="expected fp4moe start-up")
    p.add_argument("--torch-start-est-s", type=float, default=60.0, help="expected baseline start-up")
    p.add_argument("--start-timeout-s", type=float, default=240.0)
    p.add_argument("--serve-args", default="", help="more fp4moe serve flags")
    p.add_argument("--no-torch", action="store_true", help="no PyTorch baseline")
    p.add_argument("--torch-caps", default="", help="default: --caps")
    p.add_argument("--torch-steps", default="1")
    p.add_argument("--torch-args", default="", help="more bench/torch_serve/serve.py flags")
    p.add_argument("--no-fake-ceiling", dest="fake_ceiling", action="store_false",
                   help="skip the last group: `serve --backend fake` (no model time) at the largest cap, the HTTP + "
                        "scheduler ceiling")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--env", default="", help="free text recorded in summary.json (GPU, commit)")
    a = p.parse_args(argv)
    if a.input_len < 1 or a.output_len < 1 or a.prompts_factor < 1 or a.min_prompts < 1 or a.max_prompts < 1:
        p.error("lengths and prompt counts must be positive")
    for s in (a.caps, a.steps, a.torch_steps, a.torch_caps or a.caps):
        try:
            v = ints(s)
        except ValueError:
            p.error(f"not a list of integers: '{s}'")
        if not v or min(v) < 1:
            p.error(f"need positive integers: '{s}'")
    return a


if __name__ == "__main__":
    sys.exit(Sweep(parse_args()).run())
