#!/usr/bin/env python3
"""What an FP8 (E4M3) tensor-core path would cost in accuracy over FP4 expert weights (issue 43's
research track: "for MXFP4 the E2M1 x E8M0 product is exact in E4M3; for NVFP4, measure what an
FP8 path costs before using it").

For every NVFP4 expert matrix of a checkpoint (default: the trained mini model in the tree):
  W      = e2m1 x e4m3_block_scale (16 per row block) x scale_2     (the checkpoint's values)
  W8     = E4M3(W / r) x r, r = amax(row) / 448 per output row      (an FP8 weight for W8A8 wgmma)
and, as an MXFP4 checkpoint would store it, the same codes with each block scale rounded to a
power of two (E8M0):
  Wmx    = e2m1 x 2^round(log2(s x scale_2)),  Wmx8 = E4M3(Wmx / r) x r, r = 2^k per row.
Printed: the weights' rel L2 error and the share of elements not exact in E4M3; and a GEMM
y = x W^T over Gaussian activations, with x in BF16 (the engine's W4A16 path) against x in E4M3
with a per-token scale (W8A8), rel L2 of y. Numpy only; E4M3 = round to nearest even, saturating
at 448, subnormals down to 2^-9.
    python3 bench/fp4_to_fp8_error.py [model_dir] [--tokens 256]
"""
import argparse
import json
import os
import struct

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def e4m3_table():
    v = []
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            continue  # NaN
        x = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v.append(-x if s else x)
    return np.unique(np.array(v))


E4M3_VALUES = e4m3_table()
# A non-negative E4M3 value's code is its index among the non-negative values (codes 0..126 rise
# with the value); its parity is the tie rule's "even".
E4M3_POSITIVE = E4M3_VALUES[E4M3_VALUES >= 0]


def to_e4m3(x):
    """Round to the nearest E4M3 value (ties to the even code), saturating at +-448."""
    x = np.clip(x, -448.0, 448.0)
    i = np.clip(np.searchsorted(E4M3_VALUES, x), 1, len(E4M3_VALUES) - 1)
    lo, hi = E4M3_VALUES[i - 1], E4M3_VALUES[i]
    pick_hi = (hi - x) < (x - lo)
    tie = (hi - x) == (x - lo)
    hi_code = np.searchsorted(E4M3_POSITIVE, np.abs(hi))  # ties: the neighbour whose code is even
    pick_hi = np.where(tie, hi_code % 2 == 0, pick_hi)
    return np.where(pick_hi, hi, lo)


def e4m3_decode(u8):
    b = u8.astype(np.int64)
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    x = np.where(e == 0, (m / 8) * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where(s == 1, -x, x)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"U8": np.uint8, "F8_E4M3": np.uint8, "F32": np.float32, "BF16": np.uint16}  # raw bits
    out = {}
    for k, v in header.items():
        if k == "__metadata__" or v["dtype"] not in dtypes:
            continue
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], np.frombuffer(data[a:b], dtype=dtypes[v["dtype"]]).reshape(v["shape"]))
    return out


def nvfp4_matrix(t, name):
    codes = t[name][1]
    rows, half = codes.shape
    lo, hi = codes & 15, codes >> 4
    q = np.empty((rows, half * 2), dtype=np.int64)
    q[:, 0::2], q[:, 1::2] = lo, hi
    scales = e4m3_decode(t[name + "_scale"][1])  # [rows, cols / 16]
    g = float(t[name + "_scale_2"][1].reshape(-1)[0])
    return E2M1[q], scales, g


def row_fp8(w, pow2=False):
    amax = np.abs(w).max(axis=1, keepdims=True)
    r = np.where(amax > 0, amax / 448.0, 1.0)
    if pow2:
        r = 2.0 ** np.ceil(np.log2(r))
    return to_e4m3(w / r) * r


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def self_check():
    assert np.array_equal(to_e4m3(E4M3_VALUES), E4M3_VALUES), "E4M3 values must round to themselves"
    assert to_e4m3(np.array([1000.0]))[0] == 448.0 and to_e4m3(np.array([2.0 ** -10]))[0] in (0.0, 2.0 ** -9)
    pos = E4M3_POSITIVE
    mids = (pos[1:] + pos[:-1]) / 2  # ties, subnormal ones included: the neighbour with an even code
    got = to_e4m3(mids)
    even = np.where(np.arange(1, len(pos)) % 2 == 0, pos[1:], pos[:-1])
    assert np.array_equal(got, even), "E4M3 ties must round to the even code"
    assert np.array_equal(to_e4m3(-mids), -even)


def main():
    self_check()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "models", "glm5-mini-py"))
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    shards = [f for f in sorted(os.listdir(a.model_dir)) if f.endswith(".safetensors")]
    t = {}
    for s in shards:
        t.update(read_safetensors(os.path.join(a.model_dir, s)))
    names = sorted(k[: -len("_scale_2")] for k in t if k.endswith("weight_scale_2") and ".experts." in k)
    if not names:
        raise SystemExit(f"{a.model_dir}: no NVFP4 expert weights (weight / weight_scale / weight_scale_2)")
    rng = np.random.default_rng(0)
    agg = {k: [] for k in ("nv_w", "nv_inexact", "mx_w", "mx_inexact", "y_w8a16", "y_w8a8", "y_mx_w8a8")}
    for n in names:
        e2, sc, g = nvfp4_matrix(t, n)
        rows, cols = e2.shape
        blk = np.repeat(sc, 16, axis=1)[:, :cols]
        w = e2 * blk * g
        w8 = row_fp8(w)
        sc_mx = 2.0 ** np.round(np.log2(np.where(sc > 0, sc * g, 1.0)))  # MXFP4 has no global scale
        wmx = e2 * np.repeat(sc_mx, 16, axis=1)[:, :cols]
        wmx8 = row_fp8(wmx, pow2=True)
        x = rng.standard_normal((a.tokens, cols))
        xb = x.astype(np.float32).view(np.uint32) & 0xFFFF0000  # BF16 activations (truncated: a bound)
        xb = xb.view(np.float32).astype(np.float64)
        x8 = row_fp8(x)  # per-token E4M3
        y = xb @ w.T
        agg["nv_w"].append(rel(w8, w))
        agg["nv_inexact"].append(float(np.mean(w8 != w)))
        agg["mx_w"].append(rel(wmx8, wmx))
        agg["mx_inexact"].append(float(np.mean(wmx8 != wmx)))
        agg["y_w8a16"].append(rel(xb @ w8.T, y))
        agg["y_w8a8"].append(rel(x8 @ w8.T, y))
        agg["y_mx_w8a8"].append(rel(x8 @ wmx8.T, xb @ wmx.T))
    print(f"{len(names)} NVFP4 expert matrices of {os.path.abspath(a.model_dir)}; activations N(0, 1), {a.tokens} tokens")
    print("| quantity | median | max |\n|---|---|---|")
    labels = {
        "nv_w": "NVFP4 -> E4M3 per row: weights rel L2",
        "nv_inexact": "NVFP4 -> E4M3: share of weights not exact",
        "mx_w": "MXFP4 (E8M0 scales) -> E4M3, power-of-two row scale: weights rel L2",
        "mx_inexact": "MXFP4 -> E4M3: share of weights not exact",
        "y_w8a16": "NVFP4 as E4M3 weights, BF16 activations: GEMM rel L2",
        "y_w8a8": "NVFP4 as E4M3 weights, E4M3 activations (per token): GEMM rel L2",
        "y_mx_w8a8": "MXFP4 as E4M3 weights (exact), E4M3 activations: GEMM rel L2",
    }
    for k, lab in labels.items():
        v = np.array(agg[k])
        print(f"| {lab} | {np.median(v):.3g} | {v.max():.3g} |")


if __name__ == "__main__":
    main()
