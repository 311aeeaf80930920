#!/usr/bin/env python3
"""Checks that `fp4moe make-synthetic` writes complete models that transformers can load.

    python3 tools/oracle/check_synthetic.py [--fp4moe build/bin/fp4moe] [--write-fixtures tests/cli/fixtures/make_synthetic]

For each tiny preset (glm5-tiny, glm5-tiny-shared, deepseek-v3-tiny) it runs make-synthetic,
dequantizes the NVFP4 experts (nvfp4.py), drops the MTP layer (transformers has no module for
it) and loads the rest with from_pretrained: no missing, unexpected or mis-shaped tensor may be
reported. It then runs a 64-token forward (finite logits, printed rms) and checks the MTP layer's
tensors against the names transformers gives a decoder layer at that index plus the MTP glue
(enorm, hnorm, eh_proj, shared_head.norm; DeepSeek-V3 also embed_tokens, shared_head.head).

--write-fixtures writes, per preset (and for glm5-layer with --layers 2 --dense-layers 1
--mtp-layers 1, from its config alone, on the meta device), the tensor names and shapes that
transformers expects, in checkpoint naming (experts per expert, BF16 view), one
"name [d0,d1]" line each: tests/cli/make_synthetic_test.cpp compares make-synthetic's output
with them in CI, where there is no torch.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvfp4 import dequantize_state  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = ["glm5-tiny", "glm5-tiny-shared", "deepseek-v3-tiny"]
LAYER_ARGS = ["--layers", "2", "--dense-layers", "1", "--mtp-layers", "1"]  # glm5-layer fixture


def hf_config(cfg: dict, num_layers: int | None = None):
    """transformers config from a make-synthetic config.json (quantization config dropped);
    num_layers > num_hidden_layers appends MoE layers with their own indexer (the MTP layers)."""
    cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    if num_layers is not None and num_layers != cfg["num_hidden_layers"]:
        extra = num_layers - cfg["num_hidden_layers"]
        cfg["num_hidden_layers"] = num_layers
        for key, value in (("mlp_layer_types", "sparse"), ("indexer_types", "full"),
                           ("layer_types", "deepseek_sparse_attention")):
            if key in cfg:
                cfg[key] = cfg[key] + [value] * extra
    cls = {"glm_moe_dsa": transformers.GlmMoeDsaConfig, "deepseek_v3": transformers.DeepseekV3Config}[cfg["model_type"]]
    return cls(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "transformers_version")})


def expected_tensors(cfg: dict, mtp_layers: int) -> dict:
    """name -> shape transformers' model has (on the meta device), in checkpoint naming: fused
    expert stacks `mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I] become per-expert
    gate_proj/up_proj [I, H] and down_proj [H, I] (what save_pretrained writes, checked in
    check_preset), plus each MTP layer's glue."""
    n = cfg["num_hidden_layers"]
    config = hf_config(cfg, n + mtp_layers)
    with torch.device("meta"):
        model = getattr(transformers, cfg["architectures"][0])(config)
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or name.endswith("rotary_emb.original_inv_freq"):
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            E, I2, H = t.shape
            for e in range(E):
                out[f"{base}{e}.gate_proj.weight"] = [I2 // 2, H]
                out[f"{base}{e}.up_proj.weight"] = [I2 // 2, H]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            E, H, I = t.shape
            for e in range(E):
                out[f"{base}{e}.down_proj.weight"] = [H, I]
        else:
            out[name] = list(t.shape)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    for m in range(n, n + mtp_layers):
        p = f"model.layers.{m}."
        out.update({p + "enorm.weight": [H], p + "hnorm.weight": [H], p + "eh_proj.weight": [H, 2 * H],
                    p + "shared_head.norm.weight": [H]})
        if cfg["model_type"] == "deepseek_v3":
            out.update({p + "embed_tokens.weight": [V, H], p + "shared_head.head.weight": [V, H]})
    return out


def fixture_text(tensors: dict) -> str:
    return "".join(f"{k} [{','.join(map(str, v))}]\n" for k, v in sorted(tensors.items()))


def run(cmd: list) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def check_preset(fp4moe: Path, preset: str, tmp: Path) -> dict:
    src, dst = tmp / preset, tmp / (preset + ".hf")
    run([fp4moe, "make-synthetic", src, "--preset", preset, "--seed", "0"])
    cfg = json.loads((src / "config.json").read_text())
    n, mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    state, modules = dequantize_state(load_file(str(src / "model.safetensors")), cfg["quantization_config"]["quant_algo"])
    expected = expected_tensors(cfg, mtp)
    got = {k: list(v.shape) for k, v in state.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:5]
        extra = sorted(set(got) - set(expected))[:5]
        shapes = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])[:5]
        raise RuntimeError(f"{preset}: tensors differ from transformers': missing {missing}, extra {extra}, "
                           f"shapes {shapes}")
    routed = [m for m in modules if ".mlp.experts." in m]
    if len(routed) != len(modules) or not modules:
        raise RuntimeError(f"{preset}: NVFP4 modules other than routed experts: {sorted(set(modules) - set(routed))[:5]}")

    # transformers loads everything but the MTP layer(s).
    dst.mkdir()
    keep = {k: v for k, v in state.items() if not any(k.startswith(f"model.layers.{m}.") for m in range(n, n + mtp))}
    save_file(keep, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "quantization_config"}))
    cls = getattr(transformers, cfg["architectures"][0])
    model, info = cls.from_pretrained(dst, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"{preset}: transformers reports {bad}")
    ids = torch.randint(2, cfg["vocab_size"], (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"{preset}: non-finite logits")
    print(f"{preset}: {len(state)} tensors ({len(modules)} NVFP4 routed-expert linears, "
          f"{sum(k.startswith(f'model.layers.{n}.') for k in state)} in MTP layer {n}) match transformers' "
          f"{cfg['architectures'][0]}; loads with no missing/unexpected keys; 64-token forward: logits rms "
          f"{logits.pow(2).mean().sqrt().item():.3f}")
    return expected


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4moe", type=Path, default=REPO / "build" / "bin" / "fp4moe")
    ap.add_argument("--write-fixtures", type=Path, help="folder for <preset>.hf_tensors.txt")
    a = ap.parse_args()
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    fixtures = {}
    with tempfile.TemporaryDirectory(prefix="fp4moe-synthetic-") as tmp:
        for preset in TINY:
            fixtures[preset] = check_preset(a.fp4moe, preset, Path(tmp))
        d = Path(tmp) / "glm5-layer"
        run([a.fp4moe, "make-synthetic", d, "--preset", "glm5-layer", *LAYER_ARGS, "--config-only"])
        cfg = json.loads((d / "config.json").read_text())
        fixtures["glm5-layer"] = expected_tensors(cfg, cfg["num_nextn_predict_layers"])
    if a.write_fixtures:
        a.write_fixtures.mkdir(parents=True, exist_ok=True)
        for preset, t in fixtures.items():
            (a.write_fixtures / f"{preset}.hf_tensors.txt").write_text(fixture_text(t))
        print(f"wrote {len(fixtures)} fixtures to {a.write_fixtures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
