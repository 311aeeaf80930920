#!/usr/bin/env python3
"""Two dumps of the same token sequence (generate --dump-logits) by different kernel paths, e.g. the
decode steps of a greedy run vs one prefill of its prompt + generated tokens: the per-row logits
difference is the cross-path numeric noise, to set beside a near-tie flip's top-2 gap.
    logit_noise.py a.safetensors b.safetensors FIRST_ROW"""
import sys
import numpy as np
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from spec_margin import load  # noqa: E402  (the safetensors reader)

a = load(sys.argv[1]); b = load(sys.argv[2]); r0 = int(sys.argv[3])
n = min(a["logits"].shape[0], b["logits"].shape[0])
assert (a["tokens"][:n + 1] == b["tokens"][:n + 1]).all(), "the dumps' tokens differ"
for r in range(r0, n):
    x, y = a["logits"][r], b["logits"][r]
    d = np.abs(x - y); top = np.argsort(x)[-2:][::-1]
    print(f"row {r}: max |diff| {d.max():.4g}, rel L2 {np.linalg.norm(x - y) / np.linalg.norm(x):.3g}, "
          f"top-2 gap a {x[top[0]] - x[top[1]]:.4g} b {y[top[0]] - y[top[1]]:.4g}, argmax a {top[0]} b {int(np.argmax(y))}")
