#!/usr/bin/env python3
"""Margins of a greedy run's logits (generate --dump-logits) at each generated token, and where a
second run's tokens first differ: is the divergence a near-tie flip (top-2 gap within numeric noise)
or a real bug?   spec_margin.py plain.safetensors other_tokens.txt"""
import json, struct, sys
import numpy as np

def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n)); base = 8 + n
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[v["dtype"]]
        out[k] = np.frombuffer(data[a:b], dtype=dt).reshape(v["shape"])
    return out

def main():
    t = load(sys.argv[1]); print({k: v.shape for k, v in t.items()})
    toks = t["tokens"]; lg = t["logits"]
    other = [int(x) for x in open(sys.argv[2]).read().strip().split(",")]
    n_gen = len(other); P = len(toks) - n_gen
    gen = toks[P:]
    first = next((i for i in range(n_gen) if gen[i] != other[i]), None)
    print(f"prompt {P}, generated {n_gen}, first difference at generated token {first}")
    for i in range(n_gen if first is None else min(first + 1, n_gen)):
        row = lg[P - 1 + i]; top = np.argsort(row)[-2:][::-1]
        gap = row[top[0]] - row[top[1]]
        if i >= (first or n_gen) - 3:
            print(f"  token {i}: plain {gen[i]} other {other[i]}; top-2 {top.tolist()} gap {gap:.4g} "
                  f"(logit scale {np.abs(row).max():.3g}); other's logit {row[other[i]]:.5g} vs top {row[top[0]]:.5g}")
    gaps = [float(np.sort(lg[P - 1 + i])[-1] - np.sort(lg[P - 1 + i])[-2]) for i in range(n_gen)]
    print("median top-2 gap over the generated tokens", float(np.median(gaps)), "min", min(gaps))


if __name__ == "__main__":
    main()
