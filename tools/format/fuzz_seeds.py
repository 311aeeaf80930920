#!/usr/bin/env python3
"""Seed corpus and dictionary for format/'s fuzz target (tools/fuzz.sh --seeds safetensors_header).

    fuzz_seeds.py safetensors_header CORPUS_DIR DICT_PATH

Small .safetensors files: every dtype, scalar and empty tensors, an NVFP4 expert's three
tensors, metadata, an unpadded header.
"""
import json
import os
import struct
import sys

target, corpus, dict_path = sys.argv[1], sys.argv[2], sys.argv[3]
assert target == "safetensors_header", target
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
         "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "BOOL": 1}


def file_bytes(entries, meta=None, pad=True):
    header, off = {}, 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape in entries:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n * SIZES[dtype]]}
        off += n * SIZES[dtype]
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(off)


seeds = {
    "empty": file_bytes([]),
    "meta": file_bytes([], {"format": "pt"}),
    "all_dtypes": file_bytes([(f"t.{d}", d, [2, 3]) for d in SIZES], {"format": "pt", "k": "v"}),
    "scalar_and_empty": file_bytes([("s", "F32", []), ("z", "BF16", [0, 7]), ("v", "U8", [5])]),
    "nvfp4_layer": file_bytes([("model.layers.3.mlp.experts.0.gate_proj.weight", "U8", [4, 8]),
                               ("model.layers.3.mlp.experts.0.gate_proj.weight_scale", "F8_E4M3", [4, 1]),
                               ("model.layers.3.mlp.experts.0.gate_proj.weight_scale_2", "F32", [])]),
    "unpadded": file_bytes([("a", "I64", [3])], pad=False),
}
os.makedirs(corpus, exist_ok=True)
for name, b in seeds.items():
    with open(os.path.join(corpus, "seed_" + name), "wb") as f:
        f.write(b)
tokens = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '{', '}', '[', ']', ':', ',', '"',
          '\\u0000', '\\n', '-1', '1.5', '1e309', '18446744073709551615', '9223372036854775808', 'null',
          'true'] + ['"%s"' % d for d in SIZES]
with open(dict_path, "w") as f:
    for t in tokens:
        f.write('"%s"\n' % t.replace("\\", "\\\\").replace('"', '\\"'))
