"""The engine's dumps as numpy arrays, for tools/train_small/evaluate.py and the CI test of the
shipped model (tests/model/trained_model_test.py). Needs only numpy.

    dump = generate_dump(fp4moe, folder, ids, new_tokens, run)   # {"logits": [T, V], "tokens": [T]}

`run(cmd)` runs a command and returns its stdout (each caller fails its own way).
"""
import json
import os
import tempfile

import numpy as np


def read_safetensors(path):
    """Every tensor of a safetensors file (F32 / I32), keyed by name."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": np.float32, "I32": np.int32}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=dt[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def generate_dump(fp4moe, folder, ids, new_tokens, run, dump_flag="--dump-logits"):
    """`fp4moe generate` on the CPU backend (one thread) from prompt `ids`, its `dump_flag` file read back."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "dump.safetensors")
        run([fp4moe, "generate", "--model", folder, "--prompt-ids", ",".join(map(str, ids)),
             "--max-new-tokens", str(new_tokens), dump_flag, out, "--threads", "1"])
        return read_safetensors(out)
