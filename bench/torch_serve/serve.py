#!/usr/bin/env python3
"""PyTorch baseline server: a GLM-5 checkpoint (`fp4moe make-synthetic` or NVIDIA's layout) with
experts dequantized to BF16 once at load, continuous batching, an OpenAI-compatible HTTP API.

  python3 bench/torch_serve/serve.py --model /tmp/glm5-L4 --port 30001 \\
      --max-running-requests 256 --num-continuous-decode-steps 4

See bench/torch_serve/README.md for what it models and what it simplifies.
"""
import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from checkpoint import Checkpoint, CheckpointError, human_bytes, read_config, weight_bytes_estimate  # noqa: E402
from engine import Engine, Request  # noqa: E402
from http_api import Server  # noqa: E402
from model import GlmModel, KvPool  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (config.json + *.safetensors)")
    p.add_argument("--served-model-name", default="", help="model id in the API (default: the folder name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30001, help="0: any free port (printed)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "f32"], default=None, help="default: bf16 on cuda, f32 on cpu")
    p.add_argument("--max-running-requests", type=int, default=256, help="cap on requests decoding together")
    p.add_argument("--num-continuous-decode-steps", type=int, default=1, help="decode steps per scheduling round")
    p.add_argument("--max-prefill-tokens", type=int, default=16384, help="prompt tokens per prefill step")
    p.add_argument("--mem-fraction-static", type=float, default=0.88,
                   help="share of GPU memory for weights + KV pool (the rest: activations, attention workspace)")
    p.add_argument("--kv-cache-tokens", type=int, default=0, help="KV pool size in tokens (default: from memory; cpu 65536)")
    p.add_argument("--kv-cache", choices=KvPool.MODES, default="latent",
                   help="latent: MLA latents, expanded with kv_b_proj every step (fits every cap); expanded: K/V of "
                        "every head, expanded once (56x the memory at GLM-5 dims, no per-step expansion)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--attn-chunk-tokens", type=int, default=32768,
                   help="decode attention expands at most this many context tokens at once")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for name in ("max_running_requests", "num_continuous_decode_steps", "max_prefill_tokens", "page_size",
                 "attn_chunk_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if not 0 < a.mem_fraction_static <= 1:
        p.error("--mem-fraction-static must be in (0, 1]")
    return a


def log(msg):
    print(f"[torch_serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def progress(done, total):
    if sys.stderr.isatty():
        bar = "#" * (30 * done // total)
        print(f"\rloading layers [{bar:<30}] {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)
    else:
        log(f"loaded layer {done}/{total}")


def kv_pool_tokens(a, cfg, dtype_bytes, device) -> int:
    if a.kv_cache_tokens:
        return a.kv_cache_tokens
    if device.type != "cuda":
        return 65536
    total = torch.cuda.get_device_properties(device).total_memory
    used = torch.cuda.memory_allocated(device)
    per_ctx_token = dtype_bytes * (cfg.kv_lora + cfg.rope + cfg.heads * (2 * cfg.nope + cfg.v_dim + cfg.rope))
    per_prefill_token = dtype_bytes * (8 * cfg.hidden + cfg.heads * 3 * (cfg.nope + cfg.rope)
                                       + cfg.top_k * (3 * cfg.moe_inter + 2 * cfg.hidden) + 2 * cfg.inter_dense)
    workspace = int(1.5 * (a.attn_chunk_tokens * per_ctx_token + a.max_prefill_tokens * per_prefill_token))
    free = int(a.mem_fraction_static * total) - used - workspace
    per_token = KvPool.bytes_per_token(cfg, a.kv_cache, dtype_bytes)
    if free < per_token * a.page_size:
        raise CheckpointError(f"no memory left for the KV pool: {human_bytes(total)} GPU, weights {human_bytes(used)}, "
                              f"workspace {human_bytes(workspace)} at --mem-fraction-static {a.mem_fraction_static}")
    return free // per_token


def build(a):
    """(engine, config) from the arguments; CheckpointError with one line on a bad model."""
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype or ("bf16" if device.type == "cuda" else "f32")]
    cfg = read_config(a.model)
    n_dense = sum(cfg.dense_layers)
    log(f"{a.model}: {cfg.layers} layers ({n_dense} dense + {cfg.layers - n_dense} MoE), hidden {cfg.hidden}, "
        f"{cfg.experts} experts top-{cfg.top_k}; loading ~{human_bytes(weight_bytes_estimate(cfg, dtype.itemsize))} "
        f"of {str(dtype).replace('torch.', '')} weights to {device}")
    t0 = time.time()
    try:
        model = GlmModel(cfg, Checkpoint(a.model), dtype, device, progress)
    except torch.cuda.OutOfMemoryError:
        raise CheckpointError(f"the {str(dtype).replace('torch.', '')} weights (~{human_bytes(weight_bytes_estimate(cfg, dtype.itemsize))}) "
                              f"do not fit on {device}: use fewer layers") from None
    load_s = time.time() - t0
    tokens = kv_pool_tokens(a, cfg, dtype.itemsize, device)
    pages = max(tokens // a.page_size, 1)
    try:
        kv = KvPool(cfg, pages, a.page_size, a.max_running_requests, cfg.max_context, dtype, device, a.kv_cache)
    except torch.cuda.OutOfMemoryError:
        raise CheckpointError(f"a KV pool of {pages * a.page_size} tokens does not fit: lower --kv-cache-tokens or "
                              f"--mem-fraction-static") from None
    engine = Engine(model, kv, a.max_running_requests, a.num_continuous_decode_steps, a.max_prefill_tokens,
                    a.attn_chunk_tokens, a.seed, log)
    weights = torch.cuda.memory_allocated(device) - kv.nbytes() if device.type == "cuda" else 0
    log(f"loaded in {load_s:.1f} s" + (f", weights {human_bytes(weights)}" if weights else "")
        + f"; KV pool {pages * a.page_size} tokens ({human_bytes(kv.nbytes())}, {a.kv_cache}), "
        f"{pages // kv.pages_for(cfg.max_context)} requests of the max context {cfg.max_context}, "
        f"cap {a.max_running_requests} running, "
        f"{a.num_continuous_decode_steps} decode steps per round")
    return engine, cfg


def warm_up(engine):
    """One short request through the real path before the port opens (kernels load, the first
    _grouped_mm / SDPA calls pick their backends)."""
    done = []
    engine.on_tokens = lambda events: done.extend(e for e in events if e[2])
    engine.start()
    engine.submit(Request(prompt=list(range(1, 9)), max_tokens=2, ignore_eos=True, temperature=0.0))
    t0 = time.time()
    while not done and time.time() - t0 < 600 and engine.error is None:
        time.sleep(0.01)
    if not done or engine.error:
        raise RuntimeError(f"warm-up request failed: {engine.error or 'timeout'}")
    engine.stats.__init__()


def main(argv=None):
    a = parse_args(argv)
    try:
        engine, _ = build(a)
        warm_up(engine)
    except (CheckpointError, RuntimeError, OSError) as e:
        print(f"torch_serve: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. a corrupt safetensors header: still one line
        print(f"torch_serve: {a.model}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    name = a.served_model_name or os.path.basename(os.path.normpath(a.model))
    server = Server(engine, name, a.model)
    try:
        asyncio.run(server.serve(a.host, a.port, ready=lambda port: log(f"serving '{name}' on http://{a.host}:{port}")))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        print(f"torch_serve: cannot listen on {a.host}:{a.port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
