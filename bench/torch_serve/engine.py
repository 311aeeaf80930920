"""Continuous batching over GlmModel, on one engine thread.

Each round (SGLang's order): if waiting requests can be admitted (running-request cap, free KV
pages for the request's whole length, a prefill token budget), one prefill step runs them
together; otherwise `num_decode_steps` decode steps run every running request together.
Sampling is greedy (temperature 0) or plain temperature sampling, in FP32 over the full
vocabulary. A request holds its pages from admission to its end (no retraction). New tokens go
out through `on_tokens(events)` once per step, events = [(request, token, finish_reason|None)].
"""
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from model import GlmModel, KvPool, make_batch


class RequestError(ValueError):
    """A request the engine will not run; the message says why, for a 400 answer."""


@dataclass
class Request:
    prompt: list
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    output: list = field(default_factory=list)
    row: int = -1
    pages: list = field(default_factory=list)
    finish_reason: str = None
    cancelled: bool = False
    context: object = None  # the server's per-request state

    @property
    def fed(self) -> int:
        """Tokens whose latents are cached: the prompt and every output but the newest."""
        return len(self.prompt) + max(len(self.output) - 1, 0)


@dataclass
class EngineStats:
    prefill_steps: int = 0
    prefill_tokens: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    forward_seconds: float = 0.0
    finished: int = 0


class Engine:
    def __init__(self, model: GlmModel, kv: KvPool, max_running: int, num_decode_steps: int = 1,
                 max_prefill_tokens: int = 16384, attn_chunk_tokens: int = 1 << 16, seed: int = 0, log=None):
        self.model, self.kv = model, kv
        self.max_running, self.num_decode_steps = max_running, num_decode_steps
        self.max_prefill_tokens, self.attn_chunk_tokens = max_prefill_tokens, attn_chunk_tokens
        self.inbox = queue.Queue()
        self.waiting, self.running = [], []
        self.stats = EngineStats()
        self.on_tokens = lambda events: None
        self.log = log or (lambda msg: None)
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.eos = set(model.cfg.eos_ids)
        self._stop = False
        self.thread = None
        self.error = None

    # -- called from other threads ----------------------------------------------------------
    def check(self, r: Request):
        """Raises RequestError when r cannot run on this model and pool."""
        cfg = self.model.cfg
        if not r.prompt:
            raise RequestError("the prompt is empty")
        bad = next((t for t in r.prompt if not 0 <= t < cfg.vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary (size {cfg.vocab})")
        if r.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1 (got {r.max_tokens})")
        # The last query of a request sees len(prompt) + max_tokens - 1 keys.
        context = len(r.prompt) + r.max_tokens - 1
        if context > cfg.max_context:
            raise RequestError(
                f"prompt ({len(r.prompt)}) + max_tokens ({r.max_tokens}) - 1 = {context} keys exceeds {cfg.max_context}: "
                f"this baseline runs dense attention, equal to DSA only up to index_topk keys")
        if self.kv.pages_for(context) > self.kv.num_pages:
            raise RequestError(f"the request needs {context} KV tokens; the pool holds "
                               f"{self.kv.num_pages * self.kv.page_size}")

    def submit(self, r: Request):
        self.check(r)
        self.inbox.put(r)

    def start(self):
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.thread.start()

    def stop(self):
        self._stop = True
        self.inbox.put(None)
        if self.thread:
            self.thread.join()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self):
        try:
            last_log = time.monotonic()
            while not self._stop:
                self._drain_inbox(block=not self.running and not self.waiting)
                self._drop_cancelled()
                if not self._prefill_round():
                    for _ in range(self.num_decode_steps):
                        if not self.running:
                            break
                        self._decode_step()
                if time.monotonic() - last_log > 10 and (self.running or self.waiting):
                    s = self.stats
                    self.log(f"running {len(self.running)}, waiting {len(self.waiting)}, free pages "
                             f"{len(self.kv.free_pages)}/{self.kv.num_pages}; {s.decode_steps} decode steps "
                             f"(mean batch {s.decode_tokens / max(s.decode_steps, 1):.1f}), {s.prefill_tokens} prefill tokens")
                    last_log = time.monotonic()
        except Exception as e:  # a failed step: every request ends with an error, the server reports it
            self.error = f"{type(e).__name__}: {e}"
            self.log(f"engine failed: {self.error}")
            events = [(r, None, "error") for r in self.running + self.waiting]
            self.running, self.waiting = [], []
            self.on_tokens(events)
            while True:  # answer later submissions with the error too
                r = self.inbox.get()
                if r is None:
                    return
                self.on_tokens([(r, None, "error")])

    def _drain_inbox(self, block: bool):
        try:
            r = self.inbox.get(block=block)
            while True:
                if r is None:
                    return
                self.waiting.append(r)
                r = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def _drop_cancelled(self):
        for r in [r for r in self.running if r.cancelled]:
            self._finish(r, "abort")
        self.waiting = [r for r in self.waiting if not r.cancelled]

    def _prefill_round(self) -> bool:
        admitted, budget = [], self.max_prefill_tokens
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            r = self.waiting[0]
            need = len(r.prompt) + r.max_tokens - 1
            if (admitted and len(r.prompt) > budget) or not self.kv.can_hold(need):
                break
            self.waiting.pop(0)
            r.row, r.pages = self.kv.acquire(need)
            admitted.append(r)
            budget -= len(r.prompt)
        if not admitted:
            return False
        self._step([(r.row, 0, r.prompt) for r in admitted], admitted)
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens += sum(len(r.prompt) for r in admitted)
        self.running.extend(admitted)
        self._retire()
        return True

    def _decode_step(self):
        batch = list(self.running)
        self._step([(r.row, r.fed, [r.output[-1]]) for r in batch], batch)
        self.stats.decode_steps += 1
        self.stats.decode_tokens += len(batch)
        self._retire()

    def _step(self, entries, reqs):
        t0 = time.perf_counter()
        b = make_batch(entries, self.model.device)
        with torch.inference_mode():
            logits = self.model.forward(b, self.kv, self.attn_chunk_tokens)
            tokens = self._sample(logits, reqs).tolist()
        self.stats.forward_seconds += time.perf_counter() - t0
        events = []
        for r, t in zip(reqs, tokens):
            r.output.append(t)
            if len(r.output) >= r.max_tokens:
                r.finish_reason = "length"
            elif not r.ignore_eos and t in self.eos:
                r.finish_reason = "stop"
            events.append((r, t, r.finish_reason))
        self.on_tokens(events)

    def _sample(self, logits, reqs):
        greedy = logits.argmax(-1)
        temps = [r.temperature for r in reqs]
        if not any(t > 0 for t in temps):
            return greedy
        t = torch.tensor([max(x, 1e-6) for x in temps], device=logits.device)[:, None]
        sampled = torch.multinomial(torch.softmax(logits / t, -1), 1, generator=self.generator)[:, 0]
        hot = torch.tensor([x > 0 for x in temps], device=logits.device)
        return torch.where(hot, sampled, greedy)

    def _retire(self):
        for r in [r for r in self.running if r.finish_reason]:
            self._finish(r, r.finish_reason, announce=False)

    def _finish(self, r, reason, announce=True):
        self.running.remove(r)
        self.kv.release(r.row, r.pages)
        r.row, r.pages, r.finish_reason = -1, [], reason
        self.stats.finished += 1
        if announce:
            self.on_tokens([(r, None, reason)])
