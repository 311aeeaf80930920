#!/usr/bin/env python3
"""Seed corpus and dictionary for model/'s fuzz target (tools/fuzz.sh --seeds model_config).

    fuzz_seeds.py model_config CORPUS_DIR DICT_PATH

config.json texts: the model goldens' configs (tests/model/golden/*/model/config.json: GLM-5
dense / sparse / shared, DeepSeek-V3 with YaRN), each compacted, and a few edits of them at the
edges the parser checks (rope_scaling instead of rope_parameters, a quantization_config,
zero and huge sizes, wrong types).
"""
import glob
import json
import os
import sys

target, corpus, dict_path = sys.argv[1], sys.argv[2], sys.argv[3]
assert target == "model_config", target
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
os.makedirs(corpus, exist_ok=True)


def write(name, cfg):
    with open(os.path.join(corpus, "seed_" + name), "w") as f:
        f.write(json.dumps(cfg, separators=(",", ":"), sort_keys=True))


base = None
for path in sorted(glob.glob(os.path.join(root, "tests/model/golden/*/model/config.json"))):
    with open(path) as f:
        cfg = json.load(f)
    write(os.path.basename(os.path.dirname(os.path.dirname(path))), cfg)
    if cfg.get("model_type") == "glm_moe_dsa" and base is None:
        base = cfg
assert base is not None, "no GLM-5 golden config found"
edits = {
    "rope_scaling": lambda c: c.update(rope_scaling=c.pop("rope_parameters"), rope_theta=1e6),
    "quantization": lambda c: c.update(quantization_config={
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "exclude_modules": ["lm_head", "re:.*self_attn.*"]}),
    "zero_layers": lambda c: c.update(num_hidden_layers=0),
    "huge_topk": lambda c: c.update(index_topk=2 ** 40, vocab_size=2 ** 31),
    "negative_theta": lambda c: c["rope_parameters"].update(rope_theta=-1.0),
    "string_sizes": lambda c: c.update(hidden_size="64", num_attention_heads=4.5),
}
for name, edit in edits.items():
    c = json.loads(json.dumps(base))
    edit(c)
    write(name, c)
tokens = sorted({k for k in base} | {"rope_scaling", "rope_theta", "quantization_config", "quant_method",
                                      "exclude_modules", "factor", "original_max_position_embeddings",
                                      "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "rope_type"})
with open(dict_path, "w") as f:
    for t in ['"%s"' % k for k in tokens] + ["null", "true", "false", "-1", "0", "1e309", "4294967296",
                                              "18446744073709551616", "[]", "{}", '"yarn"', '"default"']:
        f.write('"%s"\n' % t.replace("\\", "\\\\").replace('"', '\\"'))
