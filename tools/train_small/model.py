"""The small GLM-5 model (GlmMoeDsaForCausalLM) in torch, computed the way fp4moe computes it
(src/model/README.md "The step"), with its MTP layer, plus the Hugging Face export / import.

Module and parameter names are the checkpoint's tensor names (state_dict() is the export).
Facts this follows (DESIGN.md item 3): interleaved RoPE pairs, on the tail of an MLA head and
the head of an indexer head; q_a / kv_a RMSNorm eps 1e-6, block norms rms_norm_eps; the indexer
key LayerNorm (with bias, eps 1e-6); indexer score sum_h w_h ReLU(q_h.k d^-1/2) with
w = weights_proj(x) n_heads^-1/2, top-k over causal keys (T <= top-k: plain causal); softmax
scale (nope + rope)^-1/2; FP32 sigmoid router, the correction bias only chooses, weights from
the unbiased scores renormalised and times routed_scaling_factor; shared expert added.

MTP layer (model.layers.{num_hidden_layers}), as SGLang's and vLLM's NextN layers read the
checkpoint: for position i, x = eh_proj([enorm(embed(token[i+1])); hnorm(h[i])]) where h[i] is
the target's last hidden state AFTER model.norm (the state lm_head reads); one decoder block
(MoE, its own indexer) at position i; shared_head.norm; the main lm_head -> logits of token i+2.
"""
import json
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 4096
    hidden: int = 256
    inter_dense: int = 512
    moe_inter: int = 128
    experts: int = 16
    top_k: int = 2
    layers: int = 4          # decoder layers; the first `dense_layers` have a dense MLP
    dense_layers: int = 1
    heads: int = 4           # glm5-tiny's attention dims (src/cli/synthetic_model.cpp)
    q_lora: int = 128
    kv_lora: int = 64
    nope: int = 32
    rope: int = 16
    v: int = 32
    index_heads: int = 16
    index_dim: int = 32
    index_topk: int = 64
    rope_theta: float = 10000.0
    eps: float = 1e-5
    routed_scaling: float = 2.5
    max_positions: int = 4096
    eos_id: int = 0


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class Norm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def lin(k, n):
    return nn.Linear(k, n, bias=False)


def rope_cos_sin(cfg, T, device):
    inv = 1.0 / torch.pow(torch.tensor(cfg.rope_theta, dtype=torch.float32),
                          torch.arange(0, cfg.rope, 2, dtype=torch.float32) / cfg.rope)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang).to(device), torch.sin(ang).to(device)  # [T, rope/2]


def rope_interleaved(x, cos, sin):
    """x [B, T, rope] or [B, T, heads, rope]: pairs (2i, 2i+1) rotated by frequency i. cos/sin [T, rope/2]."""
    if x.dim() == 4:  # [B, T, heads, rope]
        cos, sin = cos[:, None, :], sin[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)


class Indexer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wq_b = lin(cfg.q_lora, cfg.index_heads * cfg.index_dim)
        self.wk = lin(cfg.hidden, cfg.index_dim)
        self.k_norm = nn.LayerNorm(cfg.index_dim, eps=1e-6)
        self.weights_proj = lin(cfg.hidden, cfg.index_heads)

    def scores(self, h, qa, cos, sin):
        """[B, T, T] index scores, -inf above the diagonal."""
        c = self.cfg
        B, T, _ = h.shape
        R = c.rope
        k = self.k_norm(self.wk(h))
        k = torch.cat((rope_interleaved(k[..., :R], cos, sin), k[..., R:]), -1)             # [B, T, D]
        q = self.wq_b(qa).view(B, T, c.index_heads, c.index_dim)
        q = torch.cat((rope_interleaved(q[..., :R], cos, sin), q[..., R:]), -1)             # [B, T, HI, D]
        w = self.weights_proj(h) * c.index_heads ** -0.5                                   # [B, T, HI]
        dots = torch.einsum("bthd,bsd->bths", q, k) * c.index_dim ** -0.5
        s = torch.einsum("bth,bths->bts", w, F.relu(dots))
        causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
        return s.masked_fill(~causal, float("-inf"))


def topk_mask(scores, k):
    """[B, T, T] bool: the k best causal keys of each query (all of them while t + 1 <= k)."""
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
    if T <= k:
        return causal.expand_as(scores)
    idx = scores.topk(k, dim=-1).indices
    sel = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)
    return sel & causal


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        c = cfg
        self.q_a_proj = lin(c.hidden, c.q_lora)
        self.q_a_layernorm = Norm(c.q_lora, 1e-6)
        self.q_b_proj = lin(c.q_lora, c.heads * (c.nope + c.rope))
        self.kv_a_proj_with_mqa = lin(c.hidden, c.kv_lora + c.rope)
        self.kv_a_layernorm = Norm(c.kv_lora, 1e-6)
        self.kv_b_proj = lin(c.kv_lora, c.heads * (c.nope + c.v))
        self.o_proj = lin(c.heads * c.v, c.hidden)
        self.indexer = Indexer(c)

    def forward(self, h, cos, sin, sparse, want_index_loss):
        """Returns (output, indexer KL loss or None)."""
        c = self.cfg
        B, T, _ = h.shape
        N, R = c.nope, c.rope
        qa = self.q_a_layernorm(self.q_a_proj(h))
        q = self.q_b_proj(qa).view(B, T, c.heads, N + R)
        q_nope, q_rope = q[..., :N], rope_interleaved(q[..., N:], cos, sin)
        kva = self.kv_a_proj_with_mqa(h)
        ckv = self.kv_a_layernorm(kva[..., :c.kv_lora])
        kpe = rope_interleaved(kva[..., c.kv_lora:], cos, sin)                             # [B, T, R]
        kv = self.kv_b_proj(ckv).view(B, T, c.heads, N + c.v)
        k_nope, v = kv[..., :N], kv[..., N:]
        logits = (torch.einsum("bthd,bshd->bhts", q_nope, k_nope) +
                  torch.einsum("bthd,bsd->bhts", q_rope, kpe)) * (N + R) ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
        index_loss = None
        if sparse or want_index_loss:
            # DeepSeek-V3.2's indexer training: its inputs detached from the LM loss, its
            # distribution pulled (KL) toward the attention's, summed over heads.
            idx_scores = self.indexer.scores(h.detach(), qa.detach(), cos, sin)
            if want_index_loss:
                with torch.no_grad():
                    p = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1).sum(1)
                    p = p / p.sum(-1, keepdim=True)
                logq = torch.log_softmax(idx_scores, -1).masked_fill(~causal, 0.0)
                index_loss = (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1).mean()
            mask = topk_mask(idx_scores.detach(), c.index_topk) if sparse else causal
        else:
            mask = causal
        mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
        attn = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
        out = torch.einsum("bhts,bshd->bthd", attn, v).reshape(B, T, c.heads * c.v)
        return self.o_proj(out), index_loss


class Mlp(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = lin(hidden, inter)
        self.up_proj = lin(hidden, inter)
        self.down_proj = lin(inter, hidden)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.experts, cfg.hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.experts, dtype=torch.float32))


class Moe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(Mlp(cfg.hidden, cfg.moe_inter) for _ in range(cfg.experts))
        self.shared_experts = Mlp(cfg.hidden, cfg.moe_inter)
        self.last_load = None  # tokens per expert of the last forward (the bias update reads it)

    def forward(self, x):
        c = self.cfg
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(x.float() @ self.gate.weight.float().t())
        ids = (scores.detach() + self.gate.e_score_correction_bias).topk(c.top_k, dim=-1).indices
        w = scores.gather(-1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling
        out = self.shared_experts(x)
        flat = ids.flatten()
        self.last_load = torch.bincount(flat, minlength=c.experts).detach()
        order = flat.argsort()
        tok = order // c.top_k
        counts = self.last_load.tolist()
        start = 0
        routed = torch.zeros_like(x)
        for e, n in enumerate(counts):
            if n == 0:
                continue
            sel = order[start:start + n]
            t = tok[start:start + n]
            start += n
            y = self.experts[e](x[t]) * w.flatten()[sel, None].to(x.dtype)
            routed = routed.index_add(0, t, y)
        return (out + routed).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, moe, mtp=False):
        super().__init__()
        self.input_layernorm = Norm(cfg.hidden, cfg.eps)
        self.post_attention_layernorm = Norm(cfg.hidden, cfg.eps)
        self.self_attn = Attention(cfg)
        self.mlp = Moe(cfg) if moe else Mlp(cfg.hidden, cfg.inter_dense)
        if mtp:
            self.enorm = Norm(cfg.hidden, cfg.eps)
            self.hnorm = Norm(cfg.hidden, cfg.eps)
            self.eh_proj = lin(2 * cfg.hidden, cfg.hidden)
            self.shared_head = nn.Module()
            self.shared_head.norm = Norm(cfg.hidden, cfg.eps)

    def forward(self, x, cos, sin, sparse, want_index_loss):
        a, il = self.self_attn(self.input_layernorm(x), cos, sin, sparse, want_index_loss)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), il


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg, moe=i >= cfg.dense_layers) for i in range(cfg.layers))
        self.layers.append(DecoderLayer(cfg, moe=True, mtp=True))  # the MTP layer
        self.norm = Norm(cfg.hidden, cfg.eps)


class Glm5Small(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = lin(cfg.hidden, cfg.vocab)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        depth_scale = (2 * (self.cfg.layers + 1)) ** -0.5
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norms stay 1, LayerNorm bias 0
            std = 0.02 * (depth_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, tokens, sparse=True, want_index_loss=False, mtp=True):
        """tokens [B, T] -> (logits [B, T, V], mtp logits [B, T-1, V] for token i+2 or None,
        indexer KL losses). Position i of the MTP rows reads h[i] and tokens[i+1]."""
        B, T = tokens.shape
        cos, sin = rope_cos_sin(self.cfg, T, tokens.device)
        x = self.model.embed_tokens(tokens)
        index_losses = []
        for layer in self.model.layers[:self.cfg.layers]:
            x, il = layer(x, cos, sin, sparse, want_index_loss)
            if il is not None:
                index_losses.append(il)
        h = self.model.norm(x)
        logits = self.lm_head(h)
        mtp_logits = None
        if mtp and T > 1:
            m = self.model.layers[self.cfg.layers]
            e = self.model.embed_tokens(tokens[:, 1:])
            y = m.eh_proj(torch.cat((m.enorm(e), m.hnorm(h[:, :-1])), -1))
            cm, sm = rope_cos_sin(self.cfg, T - 1, tokens.device)
            y, il = m(y, cm, sm, sparse, want_index_loss)
            if il is not None:
                index_losses.append(il)
            mtp_logits = self.lm_head(m.shared_head.norm(y))
        return logits, mtp_logits, index_losses

    def update_router_bias(self, rate):
        """Auxiliary-loss-free balancing (DeepSeek-V3): raise the bias of under-loaded experts."""
        for mod in self.modules():
            if isinstance(mod, Moe) and mod.last_load is not None:
                load = mod.last_load.float()
                mod.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def hf_config(cfg):
    L = cfg.layers
    return {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
        "vocab_size": cfg.vocab, "hidden_size": cfg.hidden, "intermediate_size": cfg.inter_dense,
        "moe_intermediate_size": cfg.moe_inter, "num_hidden_layers": L, "first_k_dense_replace": cfg.dense_layers,
        "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.heads, "n_shared_experts": 1,
        "n_routed_experts": cfg.experts, "num_experts_per_tok": cfg.top_k, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": cfg.routed_scaling, "norm_topk_prob": True, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "kv_lora_rank": cfg.kv_lora, "q_lora_rank": cfg.q_lora,
        "qk_rope_head_dim": cfg.rope, "qk_nope_head_dim": cfg.nope, "qk_head_dim": cfg.nope + cfg.rope,
        "v_head_dim": cfg.v, "head_dim": cfg.rope, "rope_interleave": True, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.eps,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1, "bos_token_id": cfg.eos_id, "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.eos_id, "use_cache": True, "dtype": "bfloat16",
        "mlp_layer_types": ["dense" if i < cfg.dense_layers else "sparse" for i in range(L)],
        "layer_types": ["deepseek_sparse_attention"] * L, "index_topk": cfg.index_topk,
        "index_head_dim": cfg.index_dim, "index_n_heads": cfg.index_heads, "indexer_types": ["full"] * L,
        "indexer_rope_interleave": True, "mlp_bias": False,
    }


def config_from_hf(j):
    return Config(vocab=j["vocab_size"], hidden=j["hidden_size"], inter_dense=j["intermediate_size"],
                  moe_inter=j["moe_intermediate_size"], experts=j["n_routed_experts"], top_k=j["num_experts_per_tok"],
                  layers=j["num_hidden_layers"], dense_layers=j["first_k_dense_replace"], heads=j["num_attention_heads"],
                  q_lora=j["q_lora_rank"], kv_lora=j["kv_lora_rank"], nope=j["qk_nope_head_dim"],
                  rope=j["qk_rope_head_dim"], v=j["v_head_dim"], index_heads=j["index_n_heads"],
                  index_dim=j["index_head_dim"], index_topk=j["index_topk"],
                  rope_theta=j["rope_parameters"]["rope_theta"], eps=j["rms_norm_eps"],
                  routed_scaling=j["routed_scaling_factor"], max_positions=j["max_position_embeddings"],
                  eos_id=j["eos_token_id"])


def export_hf(model, out):
    """config.json, generation_config.json, model.safetensors (BF16; the router bias F32)."""
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    sd = {}
    for k, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        sd[k] = t.float() if k.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(model.cfg), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": model.cfg.eos_id, "eos_token_id": [model.cfg.eos_id],
                   "pad_token_id": model.cfg.eos_id}, f, indent=2)
        f.write("\n")


def load_hf(folder, tensors=None):
    """The torch model of an exported folder, FP32 compute on the stored (BF16) values. `tensors`:
    a {name: FP32 tensor} dict to use instead of model.safetensors (a dequantized checkpoint)."""
    from safetensors.torch import load_file
    with open(os.path.join(folder, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    m = Glm5Small(cfg)
    sd = tensors if tensors is not None else load_file(os.path.join(folder, "model.safetensors"))
    missing, unexpected = m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{folder}: missing {missing[:5]} unexpected {unexpected[:5]}")
    return m.eval()


def param_count(model):
    return sum(p.numel() for p in model.parameters())

