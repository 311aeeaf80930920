"""GLM-5 (GlmMoeDsaForCausalLM) forward pass in plain PyTorch, for a continuous-batching server.

One step runs a flat batch: the new tokens of several requests (a prefill's whole prompt, or
one decode token each), their positions, and per request a row of the page table of the KV
pool. Everything but attention runs on the flat [N, hidden] rows; the routed experts run as
two `torch._grouped_mm` calls over the expert-sorted rows (offsets API).

KV cache, two modes of one page pool (page table per request, pages reserved at admission):
- "latent" (default; the simplest that fits every cell of the experiment): per layer the MLA
  latent of each cached token, `[ckv (kv_lora) | k_rope (rope)]` (1,152 B/token/layer at GLM-5
  dims in BF16). Attention expands the latent of the whole context with kv_b_proj every step
  (K = [k_nope | k_rope] per head, V): ~29 MFLOP per context token per layer per step.
- "expanded" (transformers' choice): per layer K and V of every head (64 KiB/token/layer at
  GLM-5 dims), expanded once when the token is appended; steps only gather them.
Then `scaled_dot_product_attention` on the expanded K/V: prefills one request at a time
(causal), decodes all together, padded to the longest context with a boolean mask, in chunks
of at most `attn_chunk_tokens` context tokens so the gathered K/V stay bounded.

DSA: the indexer is not run. It selects min(index_topk, T) keys among the T causal keys of a
query, so while every query sees T <= index_topk keys it selects all of them and the layer is
plain causal MLA (transformers 5.17 GlmMoeDsaIndexer; fp4moe's indexer_topk_cpu). The engine
refuses requests whose context would pass `GlmConfig.max_context`.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from checkpoint import Checkpoint, GlmConfig


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: FP32 statistics, the weight applied in the input dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(x.dtype)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (x[2i], x[2i+1]) rotated by frequency i, written de-interleaved as transformers does
    ([even' | odd']); q.k dot products equal an in-place rotation's. x [N, ..., rope], cos/sin
    [N, rope/2] broadcast over the middle dims."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    c, s = cos.view(shape), sin.view(shape)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


@dataclass
class Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_a: torch.Tensor
    q_a_norm: torch.Tensor
    q_b: torch.Tensor
    kv_a: torch.Tensor
    kv_a_norm: torch.Tensor
    kv_b: torch.Tensor  # [heads * (nope + v), kv_lora]
    o: torch.Tensor
    mlp_gate_up: torch.Tensor  # dense MLP or shared expert, [2I, H] (gate rows first)
    mlp_down: torch.Tensor
    router: torch.Tensor = None  # F32 [E, H]
    router_bias: torch.Tensor = None  # F32 [E]
    experts_gate_up_t: torch.Tensor = None  # [E, H, 2I] (a transposed view of [E, 2I, H])
    experts_down_t: torch.Tensor = None  # [E, I, H]
    # kv_b_proj widened to take the whole latent [ckv | k_rope] and give per head [k_nope | k_rope | v]
    # in one GEMM: [heads * (nope + rope + v), kv_lora + rope]; the k_rope rows hold an identity, exact
    # in BF16 (1 x value + 0s). Saves the torch.cat that built K, which was ~half the step's GPU time.
    kv_b_wide: torch.Tensor = None


class KvPool:
    """The MLA latents of every cached token, per layer, in pages of `page_size` tokens, and the
    page table: one row per running request (rows are reused), the request's pages in order."""

    MODES = ("latent", "expanded")

    @staticmethod
    def bytes_per_token(cfg: GlmConfig, mode: str, dtype_bytes: int) -> int:
        per_layer = cfg.kv_lora + cfg.rope if mode == "latent" else cfg.heads * (cfg.nope + cfg.rope + cfg.v_dim)
        return cfg.layers * per_layer * dtype_bytes

    def __init__(self, cfg: GlmConfig, num_pages: int, page_size: int, rows: int, max_context: int, dtype, device,
                 mode: str = "latent"):
        if mode not in self.MODES:
            raise ValueError(f"KV cache mode {mode}: latent or expanded")
        self.mode, self.page_size = mode, page_size
        self.max_pages_per_row = -(-max_context // page_size)
        slots = num_pages * page_size
        if mode == "latent":
            self.latent = torch.zeros(cfg.layers, slots, cfg.kv_lora + cfg.rope, dtype=dtype, device=device)
            self.tensors = [self.latent]
        else:
            self.k = torch.zeros(cfg.layers, slots, cfg.heads, cfg.nope + cfg.rope, dtype=dtype, device=device)
            self.v = torch.zeros(cfg.layers, slots, cfg.heads, cfg.v_dim, dtype=dtype, device=device)
            self.tensors = [self.k, self.v]
        self.page_table = torch.zeros(rows, self.max_pages_per_row, dtype=torch.int64, device=device)
        self.free_pages = list(range(num_pages - 1, -1, -1))
        self.free_rows = list(range(rows - 1, -1, -1))
        self.num_pages = num_pages

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def can_hold(self, tokens: int) -> bool:
        return bool(self.free_rows) and self.pages_for(tokens) <= len(self.free_pages)

    def acquire(self, tokens: int):
        """A row with pages for `tokens` tokens, as (row, pages)."""
        n = self.pages_for(tokens)
        pages = [self.free_pages.pop() for _ in range(n)]
        row = self.free_rows.pop()
        self.page_table[row, :n] = torch.tensor(pages, dtype=torch.int64)
        return row, pages

    def release(self, row: int, pages: list):
        self.free_pages.extend(pages)
        self.free_rows.append(row)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Pool slots of (row, position) pairs (broadcasting)."""
        p = self.page_size
        return self.page_table[rows, torch.div(positions, p, rounding_mode="floor")] * p + positions % p


@dataclass
class StepBatch:
    """One step: requests with their new tokens (a prefill: the prompt at start 0; a decode: one
    token at start = context length before it)."""
    tokens: torch.Tensor  # I64 [N] all new tokens, request after request
    positions: torch.Tensor  # I64 [N]
    token_rows: torch.Tensor  # I64 [N] the page-table row of each token's request
    last_index: torch.Tensor  # I64 [R] index of each request's last token in the flat batch
    prefills: list  # (first flat index, length, row) of requests with more than one new token
    decode_index: torch.Tensor  # I64 [D] flat indices of the one-token requests
    decode_rows: torch.Tensor  # I64 [D]
    decode_lens: list  # context lengths (incl. the new token) of the one-token requests


def make_batch(entries, device) -> StepBatch:
    """entries: (row, start, new_tokens list) per request."""
    tokens, positions, rows, last, prefills, d_index, d_rows, d_lens = [], [], [], [], [], [], [], []
    for row, start, new in entries:
        first = len(tokens)
        tokens.extend(new)
        positions.extend(range(start, start + len(new)))
        rows.extend([row] * len(new))
        last.append(len(tokens) - 1)
        if len(new) > 1:
            if start != 0:
                raise ValueError("a multi-token step must start at position 0 (no chunked prefill here)")
            prefills.append((first, len(new), row))
        else:
            d_index.append(first)
            d_rows.append(row)
            d_lens.append(start + 1)

    def t(v):
        return torch.tensor(v, dtype=torch.int64, device=device)
    return StepBatch(t(tokens), t(positions), t(rows), t(last), prefills, t(d_index), t(d_rows), d_lens)


class GlmModel:
    def __init__(self, cfg: GlmConfig, ckpt: Checkpoint, dtype=torch.bfloat16, device="cpu", progress=None):
        self.cfg, self.dtype, self.device = cfg, dtype, torch.device(device)
        lin = lambda m: ckpt.linear(m, dtype, self.device)  # noqa: E731
        vec = lambda n: ckpt.vector(n, dtype, self.device)  # noqa: E731
        self.embed = vec("model.embed_tokens.weight")
        self.norm = vec("model.norm.weight")
        self.lm_head = lin("lm_head")
        self.layers = []
        for l in range(cfg.layers):
            p, a = f"model.layers.{l}", f"model.layers.{l}.self_attn"
            mlp = f"{p}.mlp" if cfg.dense_layers[l] else f"{p}.mlp.shared_experts"
            layer = Layer(
                input_norm=vec(f"{p}.input_layernorm.weight"), post_norm=vec(f"{p}.post_attention_layernorm.weight"),
                q_a=lin(f"{a}.q_a_proj"), q_a_norm=vec(f"{a}.q_a_layernorm.weight"), q_b=lin(f"{a}.q_b_proj"),
                kv_a=lin(f"{a}.kv_a_proj_with_mqa"), kv_a_norm=vec(f"{a}.kv_a_layernorm.weight"),
                kv_b=lin(f"{a}.kv_b_proj"), o=lin(f"{a}.o_proj"),
                mlp_gate_up=torch.cat((lin(f"{mlp}.gate_proj"), lin(f"{mlp}.up_proj"))), mlp_down=lin(f"{mlp}.down_proj"))
            layer.kv_b_wide = self.widen_kv_b(layer.kv_b)
            if not cfg.dense_layers[l]:
                layer.router = ckpt.vector(f"{p}.mlp.gate.weight", torch.float32, self.device)
                layer.router_bias = ckpt.vector(f"{p}.mlp.gate.e_score_correction_bias", torch.float32, self.device)
                E, I, H = cfg.experts, cfg.moe_inter, cfg.hidden
                gate_up = torch.empty(E, 2 * I, H, dtype=dtype, device=self.device)
                down = torch.empty(E, H, I, dtype=dtype, device=self.device)
                for e in range(E):
                    x = f"{p}.mlp.experts.{e}"
                    gate_up[e, :I] = lin(f"{x}.gate_proj")
                    gate_up[e, I:] = lin(f"{x}.up_proj")
                    down[e] = lin(f"{x}.down_proj")
                layer.experts_gate_up_t, layer.experts_down_t = gate_up.transpose(1, 2), down.transpose(1, 2)
            self.layers.append(layer)
            if progress:
                progress(l + 1, cfg.layers)
        # Decode attention pads every request's context to a multiple of this (masked): SDPA's cuDNN
        # backend builds a plan per new shape, which cost ~25 ms per layer per step while the
        # context grew by one token each step (the padded shape changes once every decode_pad steps).
        self.decode_pad = 64
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.rope, 2, dtype=torch.float32) / cfg.rope))
        self.inv_freq = self.inv_freq.to(self.device)

    def widen_kv_b(self, kv_b: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        nope, rope, v = cfg.nope, cfg.rope, cfg.v_dim
        src = kv_b.view(cfg.heads, nope + v, cfg.kv_lora)
        w = torch.zeros(cfg.heads, nope + rope + v, cfg.kv_lora + rope, dtype=kv_b.dtype, device=kv_b.device)
        w[:, :nope, :cfg.kv_lora] = src[:, :nope]
        w[:, nope:nope + rope, cfg.kv_lora:] = torch.eye(rope, dtype=kv_b.dtype, device=kv_b.device)
        w[:, nope + rope:, :cfg.kv_lora] = src[:, nope:]
        return w.view(-1, cfg.kv_lora + rope)

    # -- the step ---------------------------------------------------------------------------
    def forward(self, b: StepBatch, kv: KvPool, attn_chunk_tokens: int = 1 << 16, logit_rows=None) -> torch.Tensor:
        """F32 logits [R, vocab] of each request's last new token (or of the flat rows given);
        writes the step's latents to kv."""
        cfg = self.cfg
        x = self.embed[b.tokens]
        freqs = b.positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos().to(self.dtype), freqs.sin().to(self.dtype)
        slots = kv.slots(b.token_rows, b.positions)
        plan = self.attention_plan(b, kv, attn_chunk_tokens)
        for l, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, cfg.rms_eps)
            x = x + self.attention(l, layer, h, kv, slots, plan, cos, sin)
            h = rms_norm(x, layer.post_norm, cfg.rms_eps)
            x = x + (self.mlp(layer, h) if cfg.dense_layers[l] else self.moe(layer, h))
        h = rms_norm(x[b.last_index if logit_rows is None else logit_rows], self.norm, cfg.rms_eps)
        return (h @ self.lm_head.t()).float()

    def attention_plan(self, b: StepBatch, kv: KvPool, chunk_tokens: int):
        """Per step, shared by the layers: (prefills, decode chunks). A prefill is (flat range, its
        context slots [1, T]); a decode chunk (flat indices [B], context slots [B, T], mask
        [B, 1, 1, T]) holds requests whose padded context fits chunk_tokens (at least one)."""
        dev = self.device
        prefills = [(slice(first, first + length),
                     kv.slots(torch.tensor(row, device=dev), b.positions[first:first + length])[None])
                    for first, length, row in b.prefills]
        pad, most = self.decode_pad, kv.max_pages_per_row * kv.page_size  # padding stays in the page table
        chunks, lens, start = [], [min(-(-n // pad) * pad, most) for n in b.decode_lens], 0
        while start < len(lens):
            end, longest = start, 0
            while end < len(lens) and (end == start or max(longest, lens[end]) * (end + 1 - start) <= chunk_tokens):
                longest = max(longest, lens[end])
                end += 1
            pos = torch.arange(longest, device=dev)
            mask = pos[None, :] < torch.tensor(b.decode_lens[start:end], device=dev)[:, None]
            chunks.append((b.decode_index[start:end], kv.slots(b.decode_rows[start:end, None], pos[None, :]),
                           mask[:, None, None, :]))
            start = end
        return prefills, chunks

    def attention(self, l, layer, h, kv, slots, plan, cos, sin):
        cfg = self.cfg
        n, heads, nope, rope, v_dim = h.shape[0], cfg.heads, cfg.nope, cfg.rope, cfg.v_dim
        q_resid = rms_norm(h @ layer.q_a.t(), layer.q_a_norm, 1e-6)
        q = (q_resid @ layer.q_b.t()).view(n, heads, nope + rope)
        q = torch.cat((q[..., :nope], rope_interleaved(q[..., nope:], cos, sin)), dim=-1)
        ckv_kr = h @ layer.kv_a.t()
        ckv = rms_norm(ckv_kr[:, :cfg.kv_lora], layer.kv_a_norm, 1e-6)
        latent = torch.cat((ckv, rope_interleaved(ckv_kr[:, cfg.kv_lora:], cos, sin)), dim=-1)
        if kv.mode == "latent":
            kv.latent[l, slots] = latent
        else:
            k, v = self.expand(layer, latent[None])
            kv.k[l, slots], kv.v[l, slots] = k[0].transpose(0, 1), v[0].transpose(0, 1)
        out = torch.empty(n, heads, v_dim, dtype=h.dtype, device=h.device)
        prefills, chunks = plan
        for rng, ctx_slots in prefills:
            k, v = self.context(l, layer, kv, ctx_slots)
            qs = q[rng].transpose(0, 1)[None]  # [1, heads, T, nope + rope]
            o = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=cfg.softmax_scale)
            out[rng] = o[0].transpose(0, 1)
        for idx, ctx_slots, mask in chunks:
            k, v = self.context(l, layer, kv, ctx_slots)
            o = F.scaled_dot_product_attention(q[idx][:, :, None, :], k, v, attn_mask=mask, scale=cfg.softmax_scale)
            out[idx] = o[:, :, 0, :]
        return out.view(n, heads * v_dim) @ layer.o.t()

    def context(self, l, layer, kv, slots):
        """K [B, heads, T, nope + rope], V [B, heads, T, v] of the cached tokens at slots [B, T]."""
        if kv.mode == "latent":
            return self.expand(layer, kv.latent[l, slots])
        return kv.k[l, slots].transpose(1, 2), kv.v[l, slots].transpose(1, 2)

    def expand(self, layer, ctx):
        """Latents [B, T, kv_lora + rope] -> K [B, heads, T, nope + rope], V [B, heads, T, v]."""
        cfg = self.cfg
        B, T = ctx.shape[:2]
        kv = (ctx @ layer.kv_b_wide.t()).view(B, T, cfg.heads, cfg.nope + cfg.rope + cfg.v_dim).transpose(1, 2)
        return kv[..., :cfg.nope + cfg.rope], kv[..., cfg.nope + cfg.rope:]

    def mlp(self, layer, h):
        gu = h @ layer.mlp_gate_up.t()
        i = gu.shape[1] // 2
        return (F.silu(gu[:, :i]) * gu[:, i:]) @ layer.mlp_down.t()

    def route(self, layer, h):
        """transformers' GlmMoeDsaTopkRouter: FP32 sigmoid scores, the bias only chooses, grouped
        top-k, weights from the unbiased scores, renormalised, times routed_scaling_factor."""
        cfg = self.cfg
        scores = (h.float() @ layer.router.t()).sigmoid()
        choice = scores + layer.router_bias
        if cfg.n_group > 1:
            g = choice.view(-1, cfg.n_group, cfg.experts // cfg.n_group).topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(g).scatter_(1, g.topk(cfg.topk_group, dim=-1, sorted=False)[1], 1)
            keep = keep[:, :, None].expand(-1, -1, cfg.experts // cfg.n_group).reshape(-1, cfg.experts)
            choice = choice.masked_fill(keep == 0, float("-inf"))
        ids = choice.topk(cfg.top_k, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        if cfg.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * cfg.routed_scaling

    def moe(self, layer, h):
        cfg = self.cfg
        ids, w = self.route(layer, h)
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(torch.bincount(flat, minlength=cfg.experts), 0).to(torch.int32)
        tok = torch.div(order, cfg.top_k, rounding_mode="floor")
        gu = torch._grouped_mm(h[tok], layer.experts_gate_up_t, offs=offs)  # [N*k, 2I], rows sorted by expert
        act = F.silu(gu[:, :cfg.moe_inter]) * gu[:, cfg.moe_inter:]
        y = torch._grouped_mm(act, layer.experts_down_t, offs=offs)  # [N*k, H]
        y = y * w.view(-1)[order, None].to(y.dtype)
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device).index_add_(0, tok, y.float())
        return out.to(h.dtype) + self.mlp(layer, h)
