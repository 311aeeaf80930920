#!/usr/bin/env python3
"""Times the PyTorch baseline's decode step outside the server, and profiles one step.

  python3 bench/torch_serve/profile_step.py --model /tmp/fp4moe_glm5_L2 --batch 16,64 --context 1536

For each batch size B: a KV pool holding B requests of `--context` cached tokens (random
latents; the values do not change the work), then decode steps of B one-token requests
through GlmModel.forward as the engine runs them (one flat batch, the step's attention plan,
greedy argmax). Prints the wall time per step (CUDA-synchronised, median of --steps), then
torch.profiler's table of the ops that took the most GPU time in one step, so the step's time
can be split into attention (the expansion through kv_b_proj, SDPA), the routed experts
(_grouped_mm) and the rest. Same model and code as serve.py; no HTTP, no scheduler.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from checkpoint import Checkpoint, read_config  # noqa: E402
from model import GlmModel, KvPool, make_batch  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder (config.json + *.safetensors)")
    p.add_argument("--batch", default="16,64", help="comma-separated decode batch sizes")
    p.add_argument("--context", type=int, default=1536, help="cached tokens per request before the step")
    p.add_argument("--kv-cache", default="latent", help="comma-separated KV modes: latent, expanded")
    p.add_argument("--attn-chunk-tokens", type=int, default=32768)
    p.add_argument("--steps", type=int, default=5, help="timed steps per point")
    p.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    p.add_argument("--page-size", type=int, default=64)
    return p.parse_args(argv)


def decode_step(model, kv, batch, chunk):
    with torch.inference_mode():
        logits = model.forward(batch, kv, chunk)  # the engine's _step, less sampling options
        return logits.argmax(-1).tolist()


def main(argv=None):
    a = parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    cfg = read_config(a.model)
    t0 = time.time()
    model = GlmModel(cfg, Checkpoint(a.model), dtype, dev)
    print(f"model {a.model}: {cfg.layers} layers, loaded in {time.time() - t0:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB" if dev.type == "cuda" else "", flush=True)
    for mode in a.kv_cache.split(","):
        for B in (int(x) for x in a.batch.split(",")):
            C = a.context
            pages_per = -(-(C + 1) // a.page_size)
            need = B * pages_per * a.page_size * KvPool.bytes_per_token(cfg, mode, 2)
            free = torch.cuda.mem_get_info()[0] if dev.type == "cuda" else 16 << 30
            if need > free - (8 << 30):
                print(f"{mode} B={B} C={C}: skipped, its KV needs {need / 2**30:.1f} GiB of {free / 2**30:.1f} free")
                continue
            kv = KvPool(cfg, B * pages_per, a.page_size, B, cfg.max_context, dtype, dev, mode)
            for t in kv.tensors:
                t.normal_(0, 0.5)
            rows = [kv.acquire(C + 1)[0] for _ in range(B)]
            batch = make_batch([(r, C, [7]) for r in rows], dev)
            for _ in range(2):
                decode_step(model, kv, batch, a.attn_chunk_tokens)

            def timed(contexts, pad):
                """Median ms of decode steps at these contexts (each request one token)."""
                model.decode_pad, times = pad, []
                for c in contexts:
                    b = batch if c == C else make_batch([(r, c, [7]) for r in rows], dev)
                    sync()
                    t = time.perf_counter()
                    decode_step(model, kv, b, a.attn_chunk_tokens)
                    times.append(time.perf_counter() - t)
                model.decode_pad = 64
                return 1e3 * statistics.median(times)
            ms = timed([C] * a.steps, 64)
            print(f"{mode} B={B} C={C}: {ms:.2f} ms per decode step (median of {a.steps}), "
                  f"{B / ms * 1e3:.0f} tok/s at K=1 without the server", flush=True)
            # As in the server, the context grows by one token per step: a new attention shape each
            # step unless it is padded. Contexts below C (their pages hold the same random latents).
            grow = list(range(C - 2 * a.steps, C - a.steps))
            for pad in (64, 1):
                print(f"{mode} B={B} C={C}: growing context, decode_pad {pad}: {timed(grow, pad):.2f} ms per step",
                      flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                decode_step(model, kv, batch, a.attn_chunk_tokens)
            avg = prof.key_averages()
            key = "self_device_time_total" if hasattr(avg[0], "self_device_time_total") else "self_cuda_time_total"
            # Kernel events only (an op's row repeats its kernels' time as its own self time).
            kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
            gpu_ms = sum(e.device_time_total for e in kernels) / 1e3
            print(f"{mode} B={B} C={C}: GPU time in the profiled step {gpu_ms:.2f} ms ({len(kernels)} kernels) against "
                  f"{ms:.2f} ms wall per step", flush=True)
            print(avg.table(sort_by=key, row_limit=a.rows, max_name_column_width=60), flush=True)
            del kv, batch
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
