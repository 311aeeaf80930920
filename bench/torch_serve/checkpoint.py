"""Reads a GLM-5 (GlmMoeDsaForCausalLM) checkpoint folder: config.json + safetensors shards.

Any linear may be stored as BF16 / F32 or as NVFP4 in NVIDIA's ModelOpt layout
(`weight` U8 [N, K/2] E2M1 codes, element 2j in the low nibble; `weight_scale` E4M3 [N, K/16];
`weight_scale_2` F32 global; `input_scale` F32, not used: the baseline is W16A16). NVFP4 is
decoded on the target device as fp4moe's dequantize_rows and tools/oracle/nvfp4.py do:
mult = fp32(e4m3(scale) * global), w = fp32(e2m1 * mult), then cast to the model dtype.
"""
import glob
import json
import os
from dataclasses import dataclass

import torch
from safetensors import safe_open

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class CheckpointError(ValueError):
    """A checkpoint this baseline cannot serve; the message is one line for the user."""


@dataclass
class GlmConfig:
    vocab: int
    hidden: int
    layers: int
    dense_layers: list  # bool per layer: dense MLP (True) or MoE (False)
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int
    inter_dense: int
    moe_inter: int
    experts: int
    top_k: int
    n_group: int
    topk_group: int
    n_shared: int
    routed_scaling: float
    norm_topk_prob: bool
    rms_eps: float
    rope_theta: float
    index_topk: int  # 0: no indexer (dense causal attention at any length)
    max_positions: int
    eos_ids: list

    @property
    def softmax_scale(self) -> float:
        return (self.nope + self.rope) ** -0.5

    @property
    def max_context(self) -> int:
        """Longest context (keys seen by one query) for which this baseline equals the model:
        DSA selects min(index_topk, T) keys among the T causal ones, so with T <= index_topk it
        is dense causal attention (transformers GlmMoeDsaIndexer, fp4moe indexer_topk_cpu)."""
        return min(self.index_topk, self.max_positions) if self.index_topk else self.max_positions


def read_config(model_dir: str) -> GlmConfig:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            c = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    arch = (c.get("architectures") or ["?"])[0]
    if arch not in ("GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"):
        raise CheckpointError(f"{path}: architecture {arch}; this baseline serves GlmMoeDsaForCausalLM only")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{path}: rope_type {rope_type}; this baseline implements the default RoPE only")
    if not c.get("q_lora_rank"):
        raise CheckpointError(f"{path}: q_lora_rank is null; this baseline needs q_a_proj / q_b_proj")
    if c.get("num_key_value_heads", c["num_attention_heads"]) != c["num_attention_heads"]:
        raise CheckpointError(f"{path}: num_key_value_heads != num_attention_heads")
    layers = c["num_hidden_layers"]
    if "mlp_layer_types" in c:
        dense = [t == "dense" for t in c["mlp_layer_types"][:layers]]
    else:
        dense = [i < c.get("first_k_dense_replace", 0) for i in range(layers)]
    eos = c.get("eos_token_id")
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    return GlmConfig(
        vocab=c["vocab_size"], hidden=c["hidden_size"], layers=layers, dense_layers=dense,
        heads=c["num_attention_heads"], q_lora=c["q_lora_rank"], kv_lora=c["kv_lora_rank"],
        nope=c["qk_nope_head_dim"], rope=c["qk_rope_head_dim"], v_dim=c["v_head_dim"],
        inter_dense=c["intermediate_size"], moe_inter=c["moe_intermediate_size"],
        experts=c["n_routed_experts"], top_k=c["num_experts_per_tok"], n_group=c.get("n_group", 1),
        topk_group=c.get("topk_group", 1), n_shared=c.get("n_shared_experts", 0),
        routed_scaling=float(c.get("routed_scaling_factor", 1.0)), norm_topk_prob=bool(c.get("norm_topk_prob", True)),
        rms_eps=float(c["rms_norm_eps"]), rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        index_topk=int(c.get("index_topk", 0) or 0), max_positions=int(c.get("max_position_embeddings", 1 << 30)),
        eos_ids=eos_ids)


def dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """packed U8 [N, K/2], scales float8_e4m3fn (or its U8 bits) [N, K/16], global F32 -> F32 [N, K],
    bit-identical to tools/oracle/nvfp4.py (the E4M3 -> F32 conversion is exact)."""
    n, half_k = packed.shape
    k = 2 * half_k
    if scales.shape != (n, k // 16):
        raise CheckpointError(f"NVFP4 scales of shape {tuple(scales.shape)}, expected {(n, k // 16)}")
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(n, k).long()
    mult = scales.view(torch.float8_e4m3fn).float() * global_scale.float().reshape(())
    if torch.isnan(mult).any():
        raise CheckpointError("NaN NVFP4 block scale")
    return (table[codes].view(n, k // 16, 16) * mult[:, :, None]).view(n, k)


class Checkpoint:
    """Name -> tensor over the shards (mmap'd; a tensor is read when asked for)."""

    def __init__(self, model_dir: str):
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            raise CheckpointError(f"{model_dir}: no *.safetensors file")
        self._where = {}
        self._handles = [safe_open(f, framework="pt", device="cpu") for f in files]
        for h in self._handles:
            for name in h.keys():
                self._where[name] = h

    def has(self, name: str) -> bool:
        return name in self._where

    def raw(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint")
        return self._where[name].get_tensor(name)

    def linear(self, module: str, dtype, device) -> torch.Tensor:
        """The [N, K] weight of a linear, dequantized if NVFP4, in dtype on device."""
        w = self.raw(module + ".weight")
        if w.dtype != torch.uint8:
            return w.to(device=device, dtype=dtype)
        if not self.has(module + ".weight_scale_2"):
            raise CheckpointError(f"{module}.weight is U8 without weight_scale_2: only NVFP4 is supported")
        w = dequantize_nvfp4(w.to(device), self.raw(module + ".weight_scale").to(device),
                             self.raw(module + ".weight_scale_2").to(device))
        return w.to(dtype)

    def vector(self, name: str, dtype, device) -> torch.Tensor:
        return self.raw(name).to(device=device, dtype=dtype)


def weight_bytes_estimate(cfg: GlmConfig, dtype_bytes: int = 2) -> int:
    """Bytes of the weights this baseline holds (experts dequantized), indexer not loaded."""
    h = cfg.hidden
    attn = (cfg.q_lora * h + cfg.heads * (cfg.nope + cfg.rope) * cfg.q_lora + (cfg.kv_lora + cfg.rope) * h
            + cfg.heads * (cfg.nope + cfg.v_dim) * cfg.kv_lora + h * cfg.heads * cfg.v_dim)
    moe = cfg.experts * 3 * h * cfg.moe_inter + cfg.n_shared * 3 * h * cfg.moe_inter + cfg.experts * h
    dense = 3 * h * cfg.inter_dense
    n_dense = sum(cfg.dense_layers)
    total = cfg.layers * attn + n_dense * dense + (cfg.layers - n_dense) * moe + 2 * cfg.vocab * h
    return int(total * dtype_bytes)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


__all__ = ["GlmConfig", "Checkpoint", "CheckpointError", "read_config", "dequantize_nvfp4",
           "weight_bytes_estimate", "human_bytes"]
