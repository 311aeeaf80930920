#!/usr/bin/env python3
"""bench/torch_serve's model equals transformers (the goldens of tests/model/golden) and its
continuous batching changes no request's tokens. CPU, FP32, seconds.

Exit 77 (CTest: skipped) without torch. FP4MOE_BIN (the fp4moe binary) enables the NVFP4 cases:
the golden model is quantized with the command recorded in its meta.json, as the goldens were.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import numpy as np
    import torch
    from safetensors.torch import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "torch_serve"))
sys.path.insert(0, os.path.join(ROOT, "tools", "oracle"))

import nvfp4  # noqa: E402  tools/oracle's numpy dequantizer
from checkpoint import Checkpoint, CheckpointError, dequantize_nvfp4, read_config  # noqa: E402
from engine import Engine, Request, RequestError  # noqa: E402
from model import GlmModel, KvPool, make_batch  # noqa: E402

CASE = os.path.join(ROOT, "tests", "model", "golden", "glm5-tiny-dense")  # index_topk 128 >= 64 + 32: dense
FP4MOE = os.environ.get("FP4MOE_BIN", "")


def load(model_dir):
    cfg = read_config(model_dir)
    return GlmModel(cfg, Checkpoint(model_dir), torch.float32, "cpu")


def teacher_forced_logits(model, tokens, prompt_len):
    """Logits rows 0..len-2 as the goldens have them: the prompt's rows from one prefill step,
    then one decode step per following token."""
    kv = KvPool(model.cfg, num_pages=8, page_size=16, rows=2, max_context=128, dtype=torch.float32, device="cpu")
    row, _ = kv.acquire(len(tokens))
    rows = [model.forward(make_batch([(row, 0, tokens[:prompt_len])], "cpu"), kv, logit_rows=torch.arange(prompt_len))]
    for p in range(prompt_len, len(tokens) - 1):
        rows.append(model.forward(make_batch([(row, p, [tokens[p]])], "cpu"), kv))
    return torch.cat(rows)


def row_rel_err(a, b):
    return float(((a - b).norm(dim=1) / b.norm(dim=1)).max())


class GoldenTest(unittest.TestCase):
    def check_case(self, model_dir, golden_file):
        g = load_file(os.path.join(CASE, golden_file))
        tokens = g["tokens"].long().tolist()
        prompt_len = 64
        with torch.inference_mode():
            logits = teacher_forced_logits(load(model_dir), tokens, prompt_len)
        self.assertEqual(tuple(logits.shape), tuple(g["logits"].shape))
        err = row_rel_err(logits, g["logits"])
        self.assertLess(err, 1e-4, f"{golden_file}: logits rel L2 {err:.2e}")  # measured ~1e-6
        if os.environ.get("TORCH_SERVE_TEST_VERBOSE"):
            print(f"{golden_file}: max row rel L2 {err:.2e}")
        top2 = g["logits"].topk(2, dim=1)[0]
        clear = (top2[:, 0] - top2[:, 1]) > 1e-3
        self.assertTrue(torch.equal(logits.argmax(1)[clear], g["logits"].argmax(1)[clear]))
        return tokens

    def test_bf16_checkpoint_matches_transformers(self):
        self.check_case(os.path.join(CASE, "model"), "golden.safetensors")

    def quantized(self, variant):
        if not FP4MOE:
            self.skipTest("FP4MOE_BIN not set")
        with open(os.path.join(CASE, "meta.json")) as f:
            cmd = json.load(f)["quantize"][variant]["command"]
        out = tempfile.mkdtemp(prefix="torch_serve_test_")
        self.addCleanup(shutil.rmtree, out, True)
        args = [FP4MOE, cmd[1], os.path.join(CASE, "model"), out] + cmd[4:]
        subprocess.run(args, check=True, capture_output=True)
        return out

    def test_nvidia_nvfp4_experts_match_transformers(self):
        self.check_case(self.quantized("nvfp4"), "golden_nvfp4.safetensors")

    def test_all_linears_nvfp4_match_transformers(self):
        self.check_case(self.quantized("nvfp4_all"), "golden_nvfp4_all.safetensors")


class DequantizeTest(unittest.TestCase):
    def test_nvfp4_bit_identical_to_oracle(self):
        rng = np.random.default_rng(7)
        packed = rng.integers(0, 256, size=(24, 64), dtype=np.uint8)
        scales = rng.integers(0, 256, size=(24, 8), dtype=np.uint8)
        scales[np.isnan(nvfp4.E4M3[scales])] = 0x38  # no NaN scales
        ref = nvfp4.dequantize_nvfp4(packed, scales, 0.0123)
        got = dequantize_nvfp4(torch.from_numpy(packed), torch.from_numpy(scales), torch.tensor(0.0123))
        self.assertTrue(np.array_equal(got.numpy().view(np.uint32), ref.view(np.uint32)))

    def test_nan_scale_is_refused(self):
        packed = torch.zeros(2, 8, dtype=torch.uint8)
        scales = torch.full((2, 1), 0x7F, dtype=torch.uint8)
        with self.assertRaises(CheckpointError):
            dequantize_nvfp4(packed, scales, torch.tensor(1.0))


class BatchingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = load(os.path.join(CASE, "model"))
        g = load_file(os.path.join(CASE, "golden.safetensors"))
        cls.tokens = g["tokens"].long().tolist()

    def pool(self, mode, rows, num_pages=40):
        return KvPool(self.model.cfg, num_pages=num_pages, page_size=16, rows=rows, max_context=128,
                      dtype=torch.float32, device="cpu", mode=mode)

    def each_kv_mode(self, check):
        for mode in KvPool.MODES:
            with self.subTest(kv_cache=mode):
                check(mode)

    def test_mixed_step_equals_each_request_alone(self):
        self.each_kv_mode(self.check_mixed_step)

    def check_mixed_step(self, mode):
        m, P = self.model, 64
        kv = self.pool(mode, rows=4)
        a, b, c = kv.acquire(100), kv.acquire(100), kv.acquire(100)
        with torch.inference_mode():
            # a: 64-token prefill; b: 40-token prefill; then one step mixing a 20-token prefill (c)
            # with decodes of a and b at different context lengths.
            m.forward(make_batch([(a[0], 0, self.tokens[:P]), (b[0], 0, self.tokens[5:45])], "cpu"), kv)
            mixed = m.forward(make_batch([(a[0], P, [self.tokens[P]]), (c[0], 0, self.tokens[:20]),
                                          (b[0], 40, [self.tokens[45]])], "cpu"), kv)  # one padded chunk
            alone = [teacher_forced_logits(m, self.tokens[:P + 2], P)[-1],
                     teacher_forced_logits(m, self.tokens[:20], 20)[-1],
                     teacher_forced_logits(m, self.tokens[5:47], 40)[-1]]
        self.assertLess(row_rel_err(mixed, torch.stack(alone)), 1e-5)

    def test_one_gemm_expansion_equals_kv_b_proj_then_the_shared_rope_key(self):
        m, cfg = self.model, self.model.cfg
        layer = m.layers[0]
        ctx = torch.randn(2, 5, cfg.kv_lora + cfg.rope, generator=torch.Generator().manual_seed(3))
        k, v = m.expand(layer, ctx)
        kvb = (ctx[..., :cfg.kv_lora] @ layer.kv_b.t()).view(2, 5, cfg.heads, cfg.nope + cfg.v_dim).transpose(1, 2)
        self.assertEqual(k.shape, (2, cfg.heads, 5, cfg.nope + cfg.rope))
        torch.testing.assert_close(k[..., :cfg.nope], kvb[..., :cfg.nope], rtol=1e-5, atol=1e-5)
        self.assertTrue(torch.equal(k[..., cfg.nope:], ctx[:, None, :, cfg.kv_lora:].expand(2, cfg.heads, 5, cfg.rope)))
        torch.testing.assert_close(v, kvb[..., cfg.nope:], rtol=1e-5, atol=1e-5)

    def test_decode_padding_changes_no_logit(self):
        m, P = self.model, 40
        kv = self.pool("latent", rows=2)
        row = kv.acquire(100)[0]
        with torch.inference_mode():
            m.forward(make_batch([(row, 0, self.tokens[:P])], "cpu"), kv)
            step = make_batch([(row, P, [self.tokens[P]])], "cpu")
            padded = m.forward(step, kv)  # context 41 padded to 64
            m.decode_pad = 1
            try:
                exact = m.forward(step, kv)
            finally:
                m.decode_pad = 64
        self.assertLess(row_rel_err(padded, exact), 1e-6)

    def test_engine_runs_golden_prompts_to_golden_tokens_among_others(self):
        self.each_kv_mode(self.check_engine)

    def check_engine(self, mode):
        m, P = self.model, 64
        kv = self.pool(mode, rows=3)
        engine = Engine(m, kv, max_running=3, num_decode_steps=2, max_prefill_tokens=100, attn_chunk_tokens=150)
        finished = []
        engine.on_tokens = lambda events: finished.extend(r for r, _, reason in events if reason)
        golden = [Request(prompt=self.tokens[:P], max_tokens=32, ignore_eos=True) for _ in range(3)]
        others = [Request(prompt=self.tokens[i:i + n], max_tokens=k, ignore_eos=True)
                  for i, n, k in ((3, 10, 40), (7, 90, 5), (1, 1, 12))]
        reqs = [others[0], golden[0], others[1], golden[1], others[2], golden[2]]
        engine.start()
        for r in reqs:
            engine.submit(r)
        for _ in range(6000):
            if len(finished) == len(reqs) or engine.error:
                break
            time.sleep(0.01)
        engine.stop()
        self.assertIsNone(engine.error)
        self.assertEqual(len(finished), len(reqs))
        for r in golden:
            self.assertEqual(r.output, self.tokens[P:])
            self.assertEqual(r.finish_reason, "length")
        for r in others:
            self.assertEqual(len(r.output), r.max_tokens)
        self.assertEqual(len(kv.free_pages), kv.num_pages)  # every page came back
        self.assertGreater(engine.stats.decode_tokens / engine.stats.decode_steps, 1.5)  # requests did share steps

    def test_requests_past_the_dense_attention_limit_are_refused(self):
        engine = Engine(self.model, self.pool("latent", rows=3), max_running=3)
        engine.check(Request(prompt=[2] * 100, max_tokens=29))  # 128 keys: still every key
        for bad in (Request(prompt=[2] * 100, max_tokens=30), Request(prompt=[], max_tokens=3),
                    Request(prompt=[2, 512], max_tokens=3), Request(prompt=[2], max_tokens=0)):
            with self.assertRaises(RequestError):
                engine.check(bad)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
