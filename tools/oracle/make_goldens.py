#!/usr/bin/env python3
"""Golden files for the model tests: tiny random models built with Hugging Face transformers.

    python3 tools/oracle/make_goldens.py --out tests/model/golden [--fp4moe build/bin/fp4moe] [--case NAME ...]

For each case of cases.py it
  1. builds the model with transformers (GlmMoeDsaForCausalLM / DeepseekV3ForCausalLM) from the
     case's config, fills every weight from a seeded generator with a scale that keeps
     activations near unit size, and saves it with save_pretrained in BF16
     (e_score_correction_bias stays F32) -> <out>/<case>/model/;
  2. reloads that folder with from_pretrained in FP32 (eager attention, 1 thread) and writes
     golden.safetensors: a 64-token random prompt, 32 greedy tokens, the logits of every
     position and the per-layer hidden states of the prompt;
  3. quantizes the BF16 folder with `fp4moe quantize` twice (NVIDIA's layout: routed experts
     only with input_scale; and every linear), checks that a second run gives the same bytes,
     dequantizes the result here (nvfp4.py) and writes golden_nvfp4.safetensors and
     golden_nvfp4_all.safetensors the same way. The quantized folders are not kept.
  4. writes meta.json (versions, seed, commands, checks, sha256 of every file written).
See README.md for the file format.
"""

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import CASES  # noqa: E402
from nvfp4 import dequantize_state  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROMPT_LEN = 64
NEW_TOKENS = 32
# fp4moe quantize variants: golden file suffix -> extra arguments.
QUANT_VARIANTS = {
    "nvfp4": ["--only", "*.mlp.experts.*", "--input-amax", "8"],  # NVIDIA's layout
    "nvfp4_all": [],                                              # every linear (W4A16)
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fnv1a64(path: Path) -> str:
    """FNV-1a 64 of a file, hex: what tests/cli/golden_quantize_test.cpp recomputes in CI."""
    h = 0xCBF29CE484222325
    for b in path.read_bytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def model_class(arch: str):
    return getattr(transformers, arch)


def config_class(arch: str):
    return {"GlmMoeDsaForCausalLM": transformers.GlmMoeDsaConfig,
            "DeepseekV3ForCausalLM": transformers.DeepseekV3Config}[arch]


# ---- building the model ------------------------------------------------------------------

def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Deterministic weights, name by name in sorted order, from one generator:
    embeddings N(0, 1); every matrix (linears, router, fused expert stacks) N(0, 1/fan_in)
    with fan_in its last dim, so each projection keeps unit-size activations; RMSNorm /
    LayerNorm weights 1 + N(0, 0.1^2) and LayerNorm bias N(0, 0.1^2), so a norm that forgets
    its weight or bias shows; e_score_correction_bias N(0, 0.1^2), so the bias changes some
    expert choices (sigmoid scores have std ~0.2)."""
    g = torch.Generator().manual_seed(seed)
    state = dict(model.named_parameters())
    state.update({n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")})
    with torch.no_grad():
        for name in sorted(state):
            p = state[name]
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("embed_tokens.weight"):
                v = noise
            elif name.endswith("e_score_correction_bias") or name.endswith("norm.bias"):
                v = 0.1 * noise
            elif "norm" in name.split(".")[-2] and name.endswith(".weight"):
                v = 1.0 + 0.1 * noise
            elif p.dim() >= 2:
                v = noise / float(p.shape[-1]) ** 0.5
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))


def build_and_save(case: dict, model_dir: Path) -> None:
    cfg = config_class(case["arch"])(**case["config"])
    torch.manual_seed(case["seed"])
    model = model_class(case["arch"])(cfg).to(torch.float32)
    init_weights(model, case["seed"])
    # BF16 checkpoint, as real ones are; the router's correction bias stays F32 (as in
    # GLM-5 / DeepSeek-V3 checkpoints and transformers' _keep_in_fp32_modules_strict).
    biases = {n: b.detach().clone() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    model = model.to(torch.bfloat16)
    for n, b in biases.items():
        mod = model.get_submodule(n.rsplit(".", 1)[0])
        mod.e_score_correction_bias = b
    model.save_pretrained(model_dir)


def load_fp32(model_dir: Path, arch: str):
    model, info = model_class(arch).from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"{model_dir}: transformers reports {bad}")
    model.eval()
    return model


# ---- the golden run ----------------------------------------------------------------------

class IndexerProbe:
    """Records each DSA indexer's inputs and returned top-k (GlmMoeDsaIndexer.forward)."""

    def __init__(self, model):
        self.calls = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            ix = getattr(layer.self_attn, "indexer", None)
            if ix is None:
                continue
            self.handles.append(ix.register_forward_hook(self._hook(i), with_kwargs=True))

    def _hook(self, layer):
        def f(module, args, kwargs, out):
            names = ["hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids"]
            a = dict(zip(names, args))
            a.update(kwargs)
            self.calls[layer] = (module, a, out)
        return f

    def remove(self):
        for h in self.handles:
            h.remove()


def indexer_scores(ix, a) -> torch.Tensor:
    """Index scores [S, T] of one GlmMoeDsaIndexer call, recomputed from its inputs (batch 1, no
    cache) following DESIGN.md's statement of the indexer; the caller checks that their top-k
    equals the indices transformers returned, which validates both."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave
    x, q_resid = a["hidden_states"][0], a["q_resid"][0]
    cos, sin = a["position_embeddings"]
    S = x.shape[0]
    q = ix.wq_b(q_resid).view(S, ix.n_heads, ix.head_dim)
    k = ix.k_norm(ix.wk(x))  # [S, D]
    r = ix.qk_rope_head_dim
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q[None, :, :, :r], k[None, :, None, :r], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot[0], q[:, :, r:]], -1)            # [S, H, D]
    k = torch.cat([k_rot[0, :, 0], k[:, r:]], -1)         # [S, D]
    s = torch.relu(torch.einsum("shd,td->sht", q, k) * ix.head_dim ** -0.5)
    w = ix.weights_proj(x) * ix.n_heads ** -0.5           # [S, H]
    return torch.einsum("sh,sht->st", w, s)


def indexer_report(probe: IndexerProbe, n_rows: int):
    """Per full-indexer layer: the selected causal keys (sorted, -1 padded) [n_rows, k], and the
    smallest gap at the selection boundary (k-th minus (k+1)-th best causal score, relative to
    the row's largest |score|) over rows with more causal keys than k."""
    topk_tensors, margins = {}, {}
    for layer, (ix, a, out) in sorted(probe.calls.items()):
        idx = out[0].long()                                # [S, k]
        S, k = idx.shape
        assert S == n_rows
        scores = indexer_scores(ix, a)
        sel = torch.full((S, k), -1, dtype=torch.int32)
        worst = float("inf")
        for i in range(S):
            causal = idx[i][idx[i] <= i].sort().values
            sel[i, : causal.numel()] = causal.to(torch.int32)
            if i + 1 > k:
                row = scores[i, : i + 1]
                order = torch.argsort(row, descending=True, stable=True)
                mine = order[:k].sort().values
                if not torch.equal(mine, causal):
                    raise RuntimeError(f"layer {layer} row {i}: recomputed indexer top-k differs from transformers'")
                gap = (row[order[k - 1]] - row[order[k]]).item() / row.abs().max().item()
                worst = min(worst, gap)
            elif causal.numel() != i + 1:
                raise RuntimeError(f"layer {layer} row {i}: {causal.numel()} causal keys selected, expected {i + 1}")
        topk_tensors[f"indexer_topk.{layer}"] = sel
        margins[layer] = worst
    return topk_tensors, margins


@torch.no_grad()
def golden_run(model, prompt: torch.Tensor, n_new: int, with_indexer: bool):
    """Greedy decoding by full forwards (no cache), then one forward over tokens[:-1] for the
    logits and one over the prompt for the hidden states."""
    tokens = prompt.clone()
    for _ in range(n_new):
        nxt = model(tokens[None]).logits[0, -1].argmax()
        tokens = torch.cat([tokens, nxt[None]])
    probe = IndexerProbe(model) if with_indexer else None
    logits = model(tokens[None, :-1]).logits[0].float()     # [P+N-1, V]
    topk, margins = indexer_report(probe, tokens.numel() - 1) if probe else ({}, {})
    if probe:
        probe.remove()
    P = prompt.numel()
    greedy_ok = bool(torch.equal(logits[P - 1:].argmax(-1), tokens[P:]))
    if not greedy_ok:
        raise RuntimeError("argmax of the full-forward logits differs from the greedy loop's tokens")

    last_raw = {}

    def keep_output(module, args, out):  # returns None: the output is not replaced
        last_raw["x"] = out[0] if isinstance(out, tuple) else out

    h = model.model.layers[-1].register_forward_hook(keep_output)
    out = model(prompt[None], output_hidden_states=True)
    h.remove()
    hs = out.hidden_states
    t = {"tokens": tokens.to(torch.int32), "logits": logits.contiguous()}
    for i, x in enumerate(hs):
        t[f"hidden_states.{i}"] = x[0].float().contiguous()
    t["last_layer_output"] = last_raw["x"][0].float().contiguous()
    t.update(topk)

    # Checks recorded in meta.json (not part of the golden).
    top2 = logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    gen = model.generate(prompt[None], max_new_tokens=n_new, do_sample=False, use_cache=True,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=None,
                         eos_token_id=None)
    gen_tokens = gen.sequences[0]
    gen_logits = torch.stack([x[0] for x in gen.logits]).float()
    cached_vs_full = (gen_logits - logits[P - 1:]).abs().max().item()
    checks = {
        "logits_rms": logits.pow(2).mean().sqrt().item(),
        "hidden_rms_per_index": [x[0].pow(2).mean().sqrt().item() for x in hs],
        "min_top2_margin": margin.min().item(),
        "rows_with_top2_margin_below_1e-3": int((margin < 1e-3).sum().item()),
        "generated_contains_eos": bool((tokens[P:] == model.config.eos_token_id).any().item()),
        "generate_with_cache_same_tokens": bool(torch.equal(gen_tokens, tokens)),
        "generate_with_cache_max_abs_logit_diff_vs_full_forward": cached_vs_full,
    }
    if margins:
        checks["indexer_min_relative_boundary_gap_per_layer"] = {str(k): v for k, v in margins.items()}
    return t, checks


def write_golden(path: Path, tensors: dict) -> None:
    # One metadata key only: safetensors writes the metadata map in hash order, so more keys
    # would make the bytes differ from run to run (what the file holds is in meta.json).
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


# ---- NVFP4 ---------------------------------------------------------------------------------

def run_quantize(fp4moe: Path, src: Path, dst: Path, extra: list) -> list:
    cmd = [str(fp4moe), "quantize", str(src), str(dst), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return cmd


def dequantized_copy(qdir: Path, dst: Path) -> list:
    """Writes dst = qdir with every FP4 linear dequantized to F32 and no quantization config
    (a folder transformers loads as a plain model). Returns the dequantized modules."""
    dst.mkdir(parents=True)
    cfg = json.loads((qdir / "config.json").read_text())
    algo = cfg.pop("quantization_config")["quant_algo"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    files = sorted(p.name for p in qdir.glob("*.safetensors"))
    assert files == ["model.safetensors"], files
    state, modules = dequantize_state(load_file(str(qdir / "model.safetensors")), algo)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for extra in ("generation_config.json",):
        if (qdir / extra).exists():
            shutil.copy(qdir / extra, dst / extra)
    return modules


# ---- the command ---------------------------------------------------------------------------

def make_case(name: str, case: dict, out: Path, fp4moe: Path | None) -> None:
    cdir = out / name
    if cdir.exists():
        shutil.rmtree(cdir)
    model_dir = cdir / "model"
    build_and_save(case, model_dir)
    model = load_fp32(model_dir, case["arch"])
    g = torch.Generator().manual_seed(case["seed"] + 1)
    vocab = case["config"]["vocab_size"]
    prompt = torch.randint(2, vocab, (PROMPT_LEN,), generator=g)  # ids 0, 1 are bos / eos
    with_indexer = case["arch"] == "GlmMoeDsaForCausalLM" and case["config"]["index_topk"] < PROMPT_LEN + NEW_TOKENS
    tensors, checks = golden_run(model, prompt, NEW_TOKENS, with_indexer)
    write_golden(cdir / "golden.safetensors", tensors)
    meta = {
        "case": name,
        "about": case["about"],
        "architecture": case["arch"],
        "seed": case["seed"],
        "prompt": f"{PROMPT_LEN} ids uniform in [2, vocab) from torch.Generator().manual_seed(seed + 1)",
        "P": PROMPT_LEN,
        "N": NEW_TOKENS,
        "num_hidden_layers": model.config.num_hidden_layers,
        "indexer_types": getattr(model.config, "indexer_types", None),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "machine": platform.machine()},
        "how": "transformers built the model from the config with the case seed, tools/oracle/make_goldens.py "
               "init_weights() filled it, save_pretrained wrote it in BF16 (e_score_correction_bias F32); "
               "goldens: from_pretrained(dtype=float32, attn_implementation='eager'), torch 1 thread, greedy "
               "decoding by full forwards without cache, logits from one forward over tokens[:P+N-1], hidden "
               "states from one forward over the prompt with output_hidden_states=True",
        "golden_files": {
            "golden.safetensors": "transformers FP32 on the BF16 weights of model/",
            **{f"golden_{k}.safetensors": f"transformers FP32 on the dequantized output of quantize[{k!r}].command"
               for k in (QUANT_VARIANTS if fp4moe is not None else {})},
        },
        "checks": {"bf16": checks},
        "quantize": {},
    }
    del model
    if fp4moe is not None:
        with tempfile.TemporaryDirectory(prefix="fp4moe-oracle-") as tmp:
            for suffix, extra in QUANT_VARIANTS.items():
                q1, q2, dq = Path(tmp) / f"{suffix}.1", Path(tmp) / f"{suffix}.2", Path(tmp) / f"{suffix}.dq"
                run_quantize(fp4moe, model_dir, q1, extra)
                run_quantize(fp4moe, model_dir, q2, extra)
                files = sorted(p.name for p in q1.iterdir())
                same = files == sorted(p.name for p in q2.iterdir()) and all(
                    (q1 / f).read_bytes() == (q2 / f).read_bytes() for f in files)
                if not same:
                    raise RuntimeError(f"fp4moe quantize {' '.join(extra)}: two runs differ")
                modules = dequantized_copy(q1, dq)
                qmodel = load_fp32(dq, case["arch"])
                t, c = golden_run(qmodel, prompt, NEW_TOKENS, with_indexer)
                write_golden(cdir / f"golden_{suffix}.safetensors", t)
                meta["quantize"][suffix] = {
                    "command": ["fp4moe", "quantize", "<case>/model", "OUT", *extra],
                    "two_runs_byte_identical": same,
                    "output_sha256": {f: sha256(q1 / f) for f in files},
                    "model_safetensors_fnv1a64": fnv1a64(q1 / "model.safetensors"),
                    "quantized_modules": len(modules),
                    "dequantization": "w = e2m1 * fp32(e4m3(weight_scale) * weight_scale_2) in FP32 (as fp4moe's "
                                      "dequantize_rows); input_scale unused (activations stay FP32)",
                }
                meta["checks"][suffix] = c
                del qmodel
    meta["files_sha256"] = {str(p.relative_to(cdir)): sha256(p) for p in sorted(cdir.rglob("*")) if p.is_file()}
    (cdir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{name}: wrote {cdir} ({sum(p.stat().st_size for p in cdir.rglob('*') if p.is_file()) / 1e6:.2f} MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output folder (one subfolder per case)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (default: all)")
    ap.add_argument("--fp4moe", type=Path, default=REPO / "build" / "bin" / "fp4moe",
                    help="the fp4moe binary for the NVFP4 goldens (default: build/bin/fp4moe)")
    ap.add_argument("--no-nvfp4", action="store_true", help="BF16 goldens only")
    a = ap.parse_args()
    fp4moe = None if a.no_nvfp4 else a.fp4moe.resolve()
    if fp4moe is not None and not os.access(fp4moe, os.X_OK):
        print(f"make_goldens: {fp4moe} is not an executable (build fp4moe, or pass --fp4moe or --no-nvfp4)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.case or sorted(CASES):
        make_case(name, CASES[name], a.out, fp4moe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
