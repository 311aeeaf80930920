"""Measures the trained model and proves the engine computes the training model, then writes the
golden the CI test (tests/model/trained_model_test.py) checks the shipped checkpoint against.

    python3 tools/train_small/evaluate.py --bf16 /tmp/glm5-mini-bf16 --nvfp4 models/glm5-mini-py \
        --fp4moe build-cpu/bin/fp4moe --golden tests/model/golden/glm5-mini-py --report /tmp/eval.json

1. Tokenizer: every held-out file, and every held-out chat document (special tokens inside),
   encoded by `fp4moe tokenize` equals Hugging Face `tokenizers`.
2. Chat template: `fp4moe chat-template` renders like jinja2 as transformers sets it up.
3. Held-out loss (nats/token), MTP loss and MTP accept rate of the BF16 export and of the NVFP4
   checkpoint (dequantized exactly as the engine does, tools/oracle/nvfp4.py), in torch, with a
   unigram baseline (train-split frequencies, add-one smoothed).
4. Agreement: `fp4moe generate --dump-logits` (CPU backend, F32 KV) on held-out windows vs the
   torch model on the same stored weights: the largest per-row relative L2 error.
5. The golden: one held-out window of GOLDEN_P tokens, torch logits of some rows (full rows) and
   the NLL of every row, and a greedy continuation of a fixed chat prompt with top-2 margins.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "../oracle"))
import corpus  # noqa: E402
from engine_dump import generate_dump  # noqa: E402
from model import load_hf  # noqa: E402
from nvfp4 import dequantize_state  # noqa: E402

AGREE_WINDOWS, AGREE_LEN = 6, 192   # > index_topk 64: the DSA selection is exercised
GOLDEN_P = 112
GOLDEN_ROWS = [0, 15, 31, 47, 63, 64, 79, 95, 111]
GREEDY_PROMPT = [{"role": "user", "content": "Tests for the json module."}]
GREEDY_N = 48
GOLDEN_WINDOW_MAX_ERR = 1e-5
TEMPLATE_CASES = [
    ([{"role": "user", "content": "Hello! What is an FP4 expert?"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):\n    return x"},
      {"role": "assistant", "content": "It returns x."}, {"role": "user", "content": "Thanks\n"}], None),
    ([{"role": "user", "content": "Weather in Paris?"}],
     [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]),
]


def run(cmd, stdin=None):
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"evaluate: {' '.join(cmd[:3])} failed: {r.stderr[-1500:]}")
    return r.stdout


def engine_logits(fp4moe, folder, ids):
    return generate_dump(fp4moe, folder, ids, 1, run)["logits"][:len(ids)]


def load_nvfp4(folder):
    from safetensors.torch import load_file
    with open(os.path.join(folder, "hf_quant_config.json")) as f:
        algo = json.load(f)["quantization"]["quant_algo"]
    tensors, _ = dequantize_state(load_file(os.path.join(folder, "model.safetensors")), algo)
    return load_hf(folder, tensors)


@torch.no_grad()
def held_out_metrics(model, windows):
    tot = {"nll": 0.0, "mtp": 0.0, "acc": 0, "n": 0, "m": 0}
    for w in windows.split(8):
        logits, mtp_logits, _ = model(w[:, :-1], sparse=True)
        tot["nll"] += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        tot["mtp"] += F.cross_entropy(mtp_logits.flatten(0, 1), w[:, 2:].flatten(), reduction="sum").item()
        tot["acc"] += (mtp_logits.argmax(-1) == logits[:, 1:].argmax(-1)).sum().item()
        tot["n"] += w[:, 1:].numel()
        tot["m"] += w[:, 2:].numel()
    return {"loss": tot["nll"] / tot["n"], "mtp_loss": tot["mtp"] / tot["m"], "mtp_accept": tot["acc"] / tot["m"],
            "tokens": tot["n"]}


def check_tokenizer(tok, fp4moe, folder, held):
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for i, (path, text) in enumerate(held):
            for kind, s in (("file", text), ("document", corpus.document(path, text))):
                p = os.path.join(d, "t.txt")
                with open(p, "w", encoding="utf-8") as f:
                    f.write(s)
                ours = json.loads(run([fp4moe, "tokenize", folder, "--input", p, "--no-special-tokens"]))["ids"]
                if ours != tok.encode(s, add_special_tokens=False).ids:
                    bad += 1
                    print(f"tokenizer MISMATCH: {kind} {path}", flush=True)
    return {"files": len(held), "texts": 2 * len(held), "mismatches": bad}


def render_jinja(template, messages, tools):
    import jinja2
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env.from_string(template).render(messages=messages, tools=tools, add_generation_prompt=True)


def check_template(fp4moe, folder):
    import jinja2.sandbox  # noqa: F401
    with open(os.path.join(folder, "chat_template.jinja")) as f:
        template = f.read()
    cases = []
    with tempfile.TemporaryDirectory() as d:
        for messages, tools in TEMPLATE_CASES:
            cmd = [fp4moe, "chat-template", folder, "--add-generation-prompt"]
            if tools:
                tp = os.path.join(d, "tools.json")
                with open(tp, "w") as f:
                    json.dump(tools, f)
                cmd += ["--tools", tp]
            ours = json.loads(run(cmd, stdin=json.dumps(messages)))["prompt"]
            want = render_jinja(template, messages, tools)
            cases.append({"messages": messages, "tools": tools, "jinja2": want, "equal": ours == want})
    return cases


@torch.no_grad()
def greedy(model, ids, n):
    out, margins = list(ids), []
    for _ in range(n):
        logits, _, _ = model(torch.tensor([out]), sparse=True, mtp=False)
        top = logits[0, -1].topk(2)
        margins.append(float(top.values[0] - top.values[1]))
        out.append(int(top.indices[0]))
    return out[len(ids):], margins


@torch.no_grad()
def mtp_accept_free_running(model, held_ids, prompts=8, prompt_len=64, n=64):
    """The accept rate as greedy speculative decoding sees it: on the target's own greedy
    continuations of held-out prompts, the fraction of generated positions t where the MTP
    head's argmax from (h[t], token t+1) equals the greedy token t+2."""
    hit = tot = 0
    for k in range(prompts):
        p = held_ids[k * 997:k * 997 + prompt_len].tolist()
        gen, _ = greedy(model, p, n)
        seq = torch.tensor([p + gen])
        logits, mtp_logits, _ = model(seq, sparse=True)
        draft = mtp_logits[0].argmax(-1)          # row t: the guess for token t+2
        for t in range(prompt_len - 1, prompt_len + n - 2):
            hit += int(draft[t] == seq[0, t + 2])
            tot += 1
    return hit / tot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bf16", required=True, help="train.py's export")
    ap.add_argument("--nvfp4", required=True, help="fp4moe quantize's output (the shipped folder)")
    ap.add_argument("--fp4moe", required=True)
    ap.add_argument("--golden", help="write the CI golden here")
    ap.add_argument("--report", help="write the measurements (JSON) here")
    ap.add_argument("--corpus-tar")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--eval-windows", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.nvfp4, "tokenizer.json"))
    train_docs, held_docs = corpus.split(a.corpus_tar)
    rep = {"tokenizer": check_tokenizer(tok, a.fp4moe, a.nvfp4, held_docs)}
    print(json.dumps(rep["tokenizer"]), flush=True)
    rep["template"] = check_template(a.fp4moe, a.nvfp4)
    print("template equal:", [c["equal"] for c in rep["template"]], flush=True)

    enc = lambda docs: torch.tensor([i for e in tok.encode_batch([corpus.document(p, t) for p, t in docs],
                                                                 add_special_tokens=False) for i in e.ids])
    held_ids = enc(held_docs)
    n = min(a.eval_windows, (len(held_ids) - 1) // a.seq)
    windows = torch.stack([held_ids[i * a.seq:i * a.seq + a.seq + 1] for i in range(n)])
    counts = torch.bincount(enc(train_docs), minlength=tok.get_vocab_size()).double() + 1
    logp = torch.log(counts / counts.sum())
    rep["unigram_loss"] = float(-logp[windows[:, 1:].flatten()].mean())

    models = {"bf16": (load_hf(a.bf16), a.bf16), "nvfp4": (load_nvfp4(a.nvfp4), a.nvfp4)}
    for name, (m, folder) in models.items():
        r = held_out_metrics(m, windows)
        r["mtp_accept_free_running"] = mtp_accept_free_running(m, held_ids)
        errs, nll, cnt = [], 0.0, 0
        for k in range(AGREE_WINDOWS):
            ids = held_ids[k * AGREE_LEN:(k + 1) * AGREE_LEN + 1]
            with torch.no_grad():
                ref = m(ids[None, :-1], sparse=True, mtp=False)[0][0].numpy()
            eng = engine_logits(a.fp4moe, folder, ids[:-1].tolist())
            errs.extend((np.linalg.norm(eng - ref, axis=1) / np.linalg.norm(ref, axis=1)).tolist())
            lse = np.log(np.exp(eng - eng.max(1, keepdims=True)).sum(1)) + eng.max(1)
            nll += float((lse - eng[np.arange(AGREE_LEN), ids[1:].numpy()]).sum())
            cnt += AGREE_LEN
        errs = np.array(errs)
        r["engine_vs_torch_row_rel_l2"] = {"rows": len(errs), "max": float(errs.max()),
                                           "median": float(np.median(errs)),
                                           "rows_over_1e-4": int((errs > 1e-4).sum())}
        r["engine_loss_on_agreement_windows"] = nll / cnt
        rep[name] = r
        print(name, json.dumps(r), flush=True)

    if a.golden:
        # The first held-out window on which no discrete choice (indexer top-k, expert routing)
        # sits so near a tie that the engine's FP32 summation order flips it: every row agrees to
        # GOLDEN_WINDOW_MAX_ERR, so the CI bound measures arithmetic, not a coin toss.
        m = models["nvfp4"][0]
        for start in range(0, len(held_ids) - GOLDEN_P, GOLDEN_P):
            ids = held_ids[start:start + GOLDEN_P]
            with torch.no_grad():
                logits = m(ids[None], sparse=True, mtp=False)[0][0]
            eng = engine_logits(a.fp4moe, a.nvfp4, ids.tolist())
            err = (np.linalg.norm(eng - logits.numpy(), axis=1) / np.linalg.norm(logits.numpy(), axis=1)).max()
            if err <= GOLDEN_WINDOW_MAX_ERR:
                break
        else:
            sys.exit("evaluate: no held-out window where the engine agrees to the golden bound")
        rep["golden"] = {"window_start": start, "engine_max_row_rel_l2": float(err)}
        nll = F.cross_entropy(logits[:-1], ids[1:], reduction="none")
        with torch.no_grad():
            mtp_logits = m(ids[None], sparse=True)[1][0]   # row i: from h[i] and token i+1
        mtp_rows = [r for r in GOLDEN_ROWS if r < GOLDEN_P - 1]
        prompt = json.loads(run([a.fp4moe, "chat-template", a.nvfp4, "--add-generation-prompt"],
                                stdin=json.dumps(GREEDY_PROMPT)))["ids"]
        gen, margins = greedy(m, prompt, GREEDY_N)
        os.makedirs(a.golden, exist_ok=True)
        np.savez(os.path.join(a.golden, "golden.npz"), tokens=ids.numpy().astype(np.int32),
                 rows=np.array(GOLDEN_ROWS, dtype=np.int32), logits=logits[GOLDEN_ROWS].numpy().astype(np.float32),
                 nll=nll.numpy().astype(np.float32), mtp_rows=np.array(mtp_rows, dtype=np.int32),
                 mtp_logits=mtp_logits[mtp_rows].numpy().astype(np.float32), prompt=np.array(prompt, dtype=np.int32),
                 greedy=np.array(gen, dtype=np.int32), margins=np.array(margins, dtype=np.float32))
        with open(os.path.join(a.golden, "template_cases.json"), "w") as f:
            json.dump([{k: c[k] for k in ("messages", "tools", "jinja2")} for c in rep["template"]], f, indent=1,
                      ensure_ascii=False)
            f.write("\n")
        tok_cases = []
        for path, text in held_docs[:4]:
            s = corpus.document(path, text[:3000])
            tok_cases.append({"path": path, "text": s, "ids": tok.encode(s, add_special_tokens=False).ids})
        with open(os.path.join(a.golden, "tokenizer_cases.json"), "w") as f:
            json.dump(tok_cases, f, ensure_ascii=False)
            f.write("\n")
        rep["golden_greedy_text"] = tok.decode(gen)
        import hashlib
        with open(os.path.join(a.nvfp4, "model.safetensors"), "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        with open(os.path.join(a.golden, "meta.json"), "w") as f:
            json.dump({"made_by": "tools/train_small/evaluate.py", "model_safetensors_sha256": sha,
                       "golden_window": rep["golden"], "unigram_loss": rep["unigram_loss"],
                       "torch": torch.__version__,
                       "what": "torch FP32 on the dequantized NVFP4 weights of models/glm5-mini-py, sparse "
                               "(DSA top-k) attention; logits rows `rows` of `tokens`, NLL of every row; the MTP "
                               "head's logits rows `mtp_rows` (row i from the target's post-norm h[i] and token "
                               "i+1, i.e. --dump-mtp-logits' rows); greedy continuation of `prompt` with top-2 "
                               "margins"}, f, indent=1)
            f.write("\n")
        print("greedy:", repr(rep["golden_greedy_text"]), flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f, indent=1, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()
