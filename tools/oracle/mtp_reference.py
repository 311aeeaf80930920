#!/usr/bin/env python3
"""An independent numpy reference of the MTP (next-n) layer of a GLM-5 / DeepSeek-V3-family
checkpoint, checked against `fp4moe generate --dump-mtp-logits`.

    python3 tools/oracle/mtp_reference.py --fp4moe build-cpu/bin/fp4moe [--model DIR] [--prompt-len 40]

Without --model it writes `fp4moe make-synthetic --preset glm5-tiny` (3 layers + 1 MTP layer,
NVFP4 routed experts in the target, BF16 in the MTP layer) into a temporary folder.

Written from the public descriptions (DeepSeek-V3 technical report §2.2; the serving systems'
NextN modules, read, not copied; transformers' GlmMoeDsa for the decoder block), in float64
on the checkpoint's exact weights (BF16 widened, NVFP4 dequantized by nvfp4.py), without
fp4moe's code. For prompt position i (0 <= i < P-1):
    h_i  = the target's hidden state at i after the final norm (model.norm)
    e    = enorm(embed(t_{i+1}))            g = hnorm(h_i)
    x    = eh_proj([e | g])                 (concatenation order: embedding first)
    x    = decoder block(x) at position i   (MLA + DSA indexer + MoE, causal over the MTP
                                             layer's own keys of positions 0..i)
    logits_i = lm_head(shared_head.norm(x)) (the layer's own shared_head.head if present)
The target forward (for h) is checked too: its prompt logits against `--dump-logits`.

Bound: per row ‖fp4moe − ref‖ / ‖ref‖ <= 1e-5, the bound of the main logits goldens
(tests/model/golden_test.cpp, which derives it): fp4moe runs FP32 with an F32 KV cache on the
same weights, so the two differ by FP32 rounding only (summation order, exp / rsqrt / sin / cos
through ~10 operations per layer: ~4e-6 derived); measured 7.8e-7 (glm5-tiny) and 8.5e-7
(glm5-tiny-shared). A wrong norm, concatenation order or position moves rows by 1e-3 or more. Exit 0 on pass, 1 on a failed bound, 2 on bad input.
"""

import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvfp4 import dequantize_nvfp4  # noqa: E402

BOUND = 1e-5


# ---- safetensors (numpy only) -------------------------------------------------------------
def read_safetensors(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a:base + b]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "BF16":
            v = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            v = np.frombuffer(buf, dtype=np.float32)
        elif dt == "I32":
            v = np.frombuffer(buf, dtype=np.int32)
        elif dt in ("U8", "F8_E4M3"):
            v = np.frombuffer(buf, dtype=np.uint8)
        else:
            raise SystemExit(f"mtp_reference: tensor {name} has dtype {dt}, not handled")
        out[name] = v.reshape(shape)
    return out


class Weights:
    def __init__(self, model_dir: Path):
        self.t = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            self.t.update(read_safetensors(f))

    def has(self, name):
        return name in self.t

    def linear(self, prefix):
        """[N, K] float64 of a linear `prefix` (BF16 / F32 / NVFP4 ModelOpt layout)."""
        w = self.t[prefix + ".weight"]
        if w.dtype == np.uint8:
            gs = float(np.asarray(self.t[prefix + ".weight_scale_2"]).reshape(-1)[0])
            return dequantize_nvfp4(w, self.t[prefix + ".weight_scale"], gs).astype(np.float64)
        return w.astype(np.float64)

    def vec(self, name):
        return self.t[name].astype(np.float64)


# ---- ops ----------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rope(x, pos, theta, interleaved):
    """x [..., T, R] rotated by position pos[T]: interleaved pairs (2i, 2i+1) or halves (i, i+R/2)."""
    r = x.shape[-1]
    inv = theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)      # [R/2]
    ang = pos[:, None].astype(np.float64) * inv[None, :]             # [T, R/2]
    c, s = np.cos(ang), np.sin(ang)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : r // 2], x[..., r // 2:]
    ra, rb = a * c - b * s, b * c + a * s
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : r // 2], out[..., r // 2:] = ra, rb
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


class Reference:
    def __init__(self, model_dir: Path):
        self.c = json.loads((model_dir / "config.json").read_text())
        c = self.c
        rp = c.get("rope_parameters") or {}
        rtype = rp.get("rope_type", (c.get("rope_scaling") or {}).get("type", "default"))
        if rtype != "default":
            raise SystemExit(f"mtp_reference: rope type {rtype} is not in this reference (default only)")
        self.theta = float(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
        self.w = Weights(model_dir)
        self.L = c["num_hidden_layers"]
        self.eps = c["rms_norm_eps"]
        self.nh = c["num_attention_heads"]
        self.nope, self.r, self.v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kvr = c["kv_lora_rank"]
        self.mla_interleave = c.get("rope_interleave", True)
        self.idx_interleave = c.get("indexer_rope_interleave", True)
        self.topk = c.get("index_topk", 0)

    # attention of one layer over the whole sequence (expanded form, causal, DSA selection)
    def attention(self, p, x, pos, shared_sel):
        w, c = self.w, self.c
        T = x.shape[0]
        nh, N, R, V, C = self.nh, self.nope, self.r, self.v, self.kvr
        if c.get("q_lora_rank"):
            q_resid = rms_norm(x @ w.linear(p + "q_a_proj").T, w.vec(p + "q_a_layernorm.weight"), 1e-6)
            q = q_resid @ w.linear(p + "q_b_proj").T
        else:
            q_resid = None
            q = x @ w.linear(p + "q_proj").T
        q = q.reshape(T, nh, N + R).transpose(1, 0, 2)                   # [nh, T, N+R]
        q[..., N:] = rope(q[..., N:], pos, self.theta, self.mla_interleave)
        kva = x @ w.linear(p + "kv_a_proj_with_mqa").T                    # [T, C+R]
        ckv = rms_norm(kva[:, :C], w.vec(p + "kv_a_layernorm.weight"), 1e-6)
        kpe = rope(kva[:, C:], pos, self.theta, self.mla_interleave)      # [T, R]
        kvb = (ckv @ w.linear(p + "kv_b_proj").T).reshape(T, nh, N + V).transpose(1, 0, 2)
        k = np.concatenate([kvb[..., :N], np.broadcast_to(kpe, (nh, T, R))], -1)
        vv = kvb[..., N:]
        allowed = np.tril(np.ones((T, T), dtype=bool))
        sel = shared_sel
        if w.has(p + "indexer.wk.weight"):
            D, HI = c["index_head_dim"], c["index_n_heads"]
            ik = layer_norm(x @ w.linear(p + "indexer.wk").T, w.vec(p + "indexer.k_norm.weight"),
                            w.vec(p + "indexer.k_norm.bias"), 1e-6)
            ik[:, :R] = rope(ik[:, :R], pos, self.theta, self.idx_interleave)
            iq = (q_resid @ w.linear(p + "indexer.wq_b").T).reshape(T, HI, D).transpose(1, 0, 2)
            iq[..., :R] = rope(iq[..., :R], pos, self.theta, self.idx_interleave)
            wts = (x @ w.linear(p + "indexer.weights_proj").T) * HI ** -0.5       # [T, HI]
            s = np.maximum(iq @ ik.T * D ** -0.5, 0.0)                               # [HI, T, T]
            score = (wts.T[:, :, None] * s).sum(0)                                    # [T, T]
            sel = np.zeros((T, T), dtype=bool)
            for t in range(T):
                if t + 1 <= self.topk:
                    sel[t, : t + 1] = True
                else:
                    sel[t, np.argsort(-score[t, : t + 1], kind="stable")[: self.topk]] = True
        if sel is not None:
            allowed = allowed & sel
        scale = (N + R) ** -0.5
        att = q @ k.transpose(0, 2, 1) * scale                             # [nh, T, T]
        att = np.where(allowed[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = (att @ vv).transpose(1, 0, 2).reshape(T, nh * V)
        return o @ w.linear(p + "o_proj").T, sel

    def mlp(self, p, x):
        w, c = self.w, self.c

        def ffn(q):
            return (silu(x_ @ w.linear(q + "gate_proj").T) * (x_ @ w.linear(q + "up_proj").T)) @ w.linear(q + "down_proj").T

        x_ = x
        if not w.has(p + "gate.weight"):
            return ffn(p)
        E, K = c["n_routed_experts"], c["num_experts_per_tok"]
        ng, tg = c.get("n_group", 1), c.get("topk_group", 1)
        logits = x @ w.vec(p + "gate.weight").T
        scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores + w.vec(p + "gate.e_score_correction_bias")
        T = x.shape[0]
        out = np.zeros_like(x)
        for t in range(T):
            g = choice[t].reshape(ng, E // ng)
            gs = np.sort(g, -1)[:, -2:].sum(-1)
            keep = np.argsort(-gs, kind="stable")[:tg]
            masked = np.zeros(E)
            for gi in keep:
                masked[gi * (E // ng):(gi + 1) * (E // ng)] = choice[t, gi * (E // ng):(gi + 1) * (E // ng)]
            ids = np.argsort(-masked, kind="stable")[:K]
            wt = scores[t, ids]
            if c.get("norm_topk_prob", True):
                wt = wt / (wt.sum() + 1e-20)
            wt = wt * c.get("routed_scaling_factor", 1.0)
            for e, we in zip(ids, wt):
                q = f"{p}experts.{e}."
                xe = x[t:t + 1]
                y = (silu(xe @ w.linear(q + "gate_proj").T) * (xe @ w.linear(q + "up_proj").T)) @ w.linear(q + "down_proj").T
                out[t] += we * y[0]
        return out + ffn(p + "shared_experts.")

    def block(self, l, x, pos, sel):
        p = f"model.layers.{l}."
        w = self.w
        a, sel = self.attention(p + "self_attn.", rms_norm(x, w.vec(p + "input_layernorm.weight"), self.eps), pos, sel)
        x = x + a
        x = x + self.mlp(p + "mlp.", rms_norm(x, w.vec(p + "post_attention_layernorm.weight"), self.eps))
        return x, sel

    def head(self):
        return self.w.linear("lm_head") if self.w.has("lm_head.weight") else self.w.vec("model.embed_tokens.weight")

    def target(self, tokens):
        """(hidden after the final norm [P, H], logits [P, V])."""
        pos = np.arange(len(tokens))
        x = self.w.vec("model.embed_tokens.weight")[tokens]
        sel = None
        for l in range(self.L):
            x, sel = self.block(l, x, pos, sel if self.c.get("indexer_types", ["full"] * self.L)[l] == "shared" else None)
        h = rms_norm(x, self.w.vec("model.norm.weight"), self.eps)
        return h, h @ self.head().T

    def mtp(self, tokens, h):
        """MTP logits [P-1, V]: row i from (h_i, t_{i+1}) at position i."""
        l = self.L
        p = f"model.layers.{l}."
        w = self.w
        if not w.has(p + "eh_proj.weight"):
            raise SystemExit(f"mtp_reference: the checkpoint has no MTP layer ({p}*)")
        n = len(tokens) - 1
        emb = w.vec(p + "embed_tokens.weight") if w.has(p + "embed_tokens.weight") else w.vec("model.embed_tokens.weight")
        e = rms_norm(emb[tokens[1:]], w.vec(p + "enorm.weight"), self.eps)
        g = rms_norm(h[:n], w.vec(p + "hnorm.weight"), self.eps)
        x = np.concatenate([e, g], -1) @ w.linear(p + "eh_proj").T
        x, _ = self.block(l, x, np.arange(n), None)
        x = rms_norm(x, w.vec(p + "shared_head.norm.weight"), self.eps)
        head = w.linear(p + "shared_head.head") if w.has(p + "shared_head.head.weight") else self.head()
        return x @ head.T


def rel_rows(a, ref):
    return np.linalg.norm(a - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp4moe", required=True)
    ap.add_argument("--model")
    ap.add_argument("--preset", default="glm5-tiny", help="make-synthetic preset when --model is not given")
    ap.add_argument("--prompt-len", type=int, default=40)
    a = ap.parse_args()
    if a.prompt_len < 2:
        print("mtp_reference: --prompt-len must be >= 2", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = Path(a.model) if a.model else tmp / "model"
        if not a.model:
            subprocess.run([a.fp4moe, "make-synthetic", str(model), "--preset", a.preset], check=True,
                           stdout=subprocess.DEVNULL)
        ref = Reference(model)
        vocab = ref.c["vocab_size"]
        tokens = np.array([(7 + 37 * i) % vocab for i in range(a.prompt_len)], dtype=np.int64)
        ids = ",".join(str(t) for t in tokens)
        subprocess.run([a.fp4moe, "generate", "--model", str(model), "--prompt-ids", ids, "--max-new-tokens", "1",
                        "--kv-dtype", "f32", "--threads", "1", "--dump-logits", str(tmp / "logits.safetensors"),
                        "--dump-mtp-logits", str(tmp / "mtp.safetensors")], check=True, stdout=subprocess.DEVNULL)
        dump = read_safetensors(tmp / "mtp.safetensors")
        main_dump = read_safetensors(tmp / "logits.safetensors")
        if list(dump["tokens"]) != list(tokens) or dump["mtp_logits"].shape != (len(tokens) - 1, vocab):
            print(f"FAIL: dump holds tokens {dump['tokens'].shape} / mtp_logits {dump['mtp_logits'].shape}")
            return 1
        h, logits = ref.target(tokens)
        mtp = ref.mtp(tokens, h)
        e_main = rel_rows(main_dump["logits"][: len(tokens)].astype(np.float64), logits)
        e_mtp = rel_rows(dump["mtp_logits"].astype(np.float64), mtp)
        agree = float((dump["mtp_logits"].argmax(-1) == mtp.argmax(-1)).mean())
        print(f"target prompt logits: max rel L2 {e_main.max():.2e} over {len(e_main)} rows")
        print(f"MTP logits: max rel L2 {e_mtp.max():.2e} over {len(e_mtp)} rows (bound {BOUND}); argmax agrees on "
              f"{agree:.0%} of rows")
        ok = e_main.max() <= BOUND and e_mtp.max() <= BOUND
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
