"""NVFP4 (and MXFP4) dequantization of ModelOpt-layout checkpoints, written from the format spec.

A quantized linear layer `<module>` is stored as
    <module>.weight          U8       [N, K/2]   E2M1 codes, element 2j in the LOW nibble of byte j
    <module>.weight_scale    F8_E4M3  [N, K/16]  one block scale per 16 elements along K
                             (MXFP4: U8 E8M0 [N, K/32], value 2^(s-127))
    <module>.weight_scale_2  F32      [] or [1]  NVFP4 global scale (ModelOpt: amax / (6 * 448))
    <module>.input_scale     F32      []         activation global scale (W4A4); not used here
E2M1 code: bit 3 sign, bits 2..0 index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0.
E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits, subnormals, 0x7F/0xFF NaN.

The value is computed exactly as fp4moe's dequantize_rows does (src/format/fp4.cpp), so the
FP32 weights are bit-identical to the engine's: mult = fp32(e4m3(scale) * global), then
w = fp32(e2m1 * mult).
"""

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def e4m3_table() -> np.ndarray:
    """float32 value of each E4M3 (fn) code; NaN for 0x7F / 0xFF."""
    t = np.empty(256, dtype=np.float32)
    for c in range(256):
        sign = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 0xF, c & 0x7
        if e == 0xF and m == 0x7:
            t[c] = np.nan
        elif e == 0:
            t[c] = sign * (m / 8.0) * 2.0 ** -6
        else:
            t[c] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = e4m3_table()


def dequantize_nvfp4(packed: np.ndarray, scales: np.ndarray, global_scale: float) -> np.ndarray:
    """packed U8 [N, K/2], scales U8 (E4M3 bits) [N, K/16], global F32 -> float32 [N, K]."""
    n, half_k = packed.shape
    k = half_k * 2
    if scales.shape != (n, k // 16):
        raise ValueError(f"NVFP4 scales shape {scales.shape}, expected {(n, k // 16)}")
    codes = np.empty((n, k), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    mult = (E4M3[scales] * np.float32(global_scale)).astype(np.float32)  # [N, K/16]
    if np.isnan(mult).any():
        raise ValueError("NaN block scale")
    return (E2M1[codes].reshape(n, k // 16, 16) * mult[:, :, None]).astype(np.float32).reshape(n, k)


def dequantize_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """packed U8 [N, K/2], scales U8 (E8M0) [N, K/32] -> float32 [N, K]."""
    n, half_k = packed.shape
    k = half_k * 2
    codes = np.empty((n, k), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    if (scales == 0xFF).any():
        raise ValueError("NaN E8M0 scale")
    mult = np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)
    return (E2M1[codes].reshape(n, k // 32, 32) * mult[:, :, None]).astype(np.float32).reshape(n, k)


def dequantize_state(tensors: dict, quant_algo: str) -> tuple[dict, list]:
    """Dequantizes every FP4 linear of a name -> torch tensor dict (as safetensors.torch loads a
    checkpoint: U8 weights, float8_e4m3fn or U8 scales). Returns the new dict (each quantized
    weight as a float32 `.weight`, its weight_scale / weight_scale_2 / input_scale dropped, all
    other tensors unchanged) and the sorted list of dequantized module names."""
    import torch

    mx = "MXFP4" in quant_algo.upper()
    out, modules, drop = {}, [], set()
    for name, t in tensors.items():
        if not name.endswith(".weight") or t.dtype != torch.uint8:
            continue
        module = name[: -len(".weight")]
        scales = tensors.get(module + ".weight_scale")
        if scales is None:
            raise ValueError(f"{name} is U8 but {module}.weight_scale is missing")
        packed = t.numpy()
        sc = scales.view(torch.uint8).numpy()
        if mx:
            w = dequantize_mxfp4(packed, sc)
        else:
            gs = tensors.get(module + ".weight_scale_2")
            if gs is None:
                raise ValueError(f"{name} is NVFP4 but {module}.weight_scale_2 is missing")
            w = dequantize_nvfp4(packed, sc, float(gs.float().reshape(-1)[0]))
        out[name] = torch.from_numpy(w)
        modules.append(module)
        drop.update({module + s for s in (".weight_scale", ".weight_scale_2", ".input_scale")})
    for name, t in tensors.items():
        if name not in out and name not in drop:
            out[name] = t
    return out, sorted(modules)
