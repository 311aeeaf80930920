"""Trains the small GLM-5-architecture model (model.py) on the standard-library corpus
(corpus.py) with the committed tokenizer, and exports it in the Hugging Face layout fp4moe
loads (config.json, generation_config.json, model.safetensors BF16, the tokenizer files and
chat template copied from --tokenizer-dir).

    nice -n 10 python3 tools/train_small/train.py --out /tmp/glm5-mini-bf16 --minutes 35   # CPU, one thread
    python3 tools/train_small/train.py --out OUT --device cuda --minutes 8 --batch 64   # on a GPU

Needs only torch, safetensors and tokenizers (requirements.txt) and the corpus (this machine's
/usr/lib/python3.*/ or --corpus-tar from `corpus.py pack`). Loss per step: next-token
cross-entropy + MTP_WEIGHT x the MTP layer's cross-entropy on token i+2 + the indexers' KL to
their layer's attention (DeepSeek-V3.2: indexer inputs detached). The first DENSE_FRACTION of the
time attention is dense (the indexer warms up), then DSA's top-k selection is on. The learning
rate follows the wall clock (warm-up, cosine to 10 %), so --minutes sets the whole run.
"""
import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from model import Config, Glm5Small, export_hf, param_count  # noqa: E402

MTP_WEIGHT = 0.3
DENSE_FRACTION = 0.1
ROUTER_BIAS_RATE = 1e-3
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TOKENIZER_DIR = os.path.join(HERE, "../../models/glm5-mini-py")


def encode_docs(tok, docs):
    ids = []
    for enc in tok.encode_batch([corpus.document(p, t) for p, t in docs], add_special_tokens=False):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


def held_out_windows(ids, seq, count):
    """Fixed, non-overlapping windows of seq + 1 tokens from the start of the held-out stream."""
    n = min(count, (len(ids) - 1) // seq)
    return torch.stack([ids[i * seq:i * seq + seq + 1] for i in range(n)])


def losses(model, win, sparse, want_index_loss):
    x, y = win[:, :-1], win[:, 1:]
    logits, mtp_logits, index_losses = model(x, sparse=sparse, want_index_loss=want_index_loss)
    main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
    mtp = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]).float(), win[:, 2:].reshape(-1))
    index = sum(index_losses) / len(index_losses) if index_losses else torch.zeros(())
    return main, mtp, index, logits, mtp_logits


@torch.no_grad()
def evaluate(model, windows, batch):
    """Held-out next-token loss (nats/token), MTP loss on token i+2, and MTP accept rate: the
    fraction of positions i where the MTP head's argmax equals the target's greedy token at
    i+2 given the true prefix up to i+1 (teacher-forced)."""
    model.eval()
    tot = {"main": 0.0, "mtp": 0.0, "accept": 0.0, "n_main": 0, "n_mtp": 0}
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        main, mtp, _, logits, mtp_logits = losses(model, w, sparse=True, want_index_loss=False)
        n, m = w[:, 1:].numel(), w[:, 2:].numel()
        tot["main"] += main.item() * n
        tot["mtp"] += mtp.item() * m
        tot["n_main"] += n
        tot["n_mtp"] += m
        # Target's greedy token at i+2: argmax of the main logits at row i+1.
        tot["accept"] += (mtp_logits.argmax(-1) == logits[:, 1:].argmax(-1)).sum().item()
    model.train()
    return {"loss": tot["main"] / tot["n_main"], "mtp_loss": tot["mtp"] / tot["n_mtp"],
            "mtp_accept": tot["accept"] / tot["n_mtp"], "tokens": tot["n_main"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="export folder (created)")
    ap.add_argument("--minutes", type=float, default=35.0, help="wall-clock training budget")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows of --seq tokens")
    ap.add_argument("--tokenizer-dir", default=DEFAULT_TOKENIZER_DIR,
                    help="folder with tokenizer.json, tokenizer_config.json, chat_template.jinja")
    ap.add_argument("--corpus-tar", help="corpus tarball from corpus.py pack (default: /usr/lib/python3.*)")
    a = ap.parse_args()
    if a.minutes <= 0 or a.batch < 1 or a.seq < 2 or a.threads < 1 or a.lr <= 0 or a.eval_windows < 1:
        sys.exit("train.py: --minutes, --batch, --threads, --lr and --eval-windows must be positive, --seq >= 2")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("train.py: --device cuda but torch sees no GPU")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    train_docs, held_docs = corpus.split(a.corpus_tar)
    train_ids, held_ids = encode_docs(tok, train_docs), encode_docs(tok, held_docs)
    print(f"corpus: train {len(train_docs)} files {len(train_ids)} tokens, held-out {len(held_docs)} files "
          f"{len(held_ids)} tokens", flush=True)
    dev = torch.device(a.device)
    windows = held_out_windows(held_ids, a.seq, a.eval_windows).to(dev)

    cfg = Config(vocab=tok.get_vocab_size())
    model = Glm5Small(cfg)
    model.init_weights(a.seed)
    model.to(dev).train()
    print(f"model: {param_count(model) / 1e6:.2f} M parameters; {json.dumps(cfg.__dict__)}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))

    budget = a.minutes * 60.0
    t0 = time.time()
    step, log = 0, []
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0:
            break
        lr = a.lr * (min(1.0, step / 50) if step < 50 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = [rng.randrange(0, len(train_ids) - a.seq - 1) for _ in range(a.batch)]
        win = torch.stack([train_ids[s:s + a.seq + 1] for s in starts]).to(dev)
        sparse = frac >= DENSE_FRACTION
        main_l, mtp_l, index_l, _, _ = losses(model, win, sparse=sparse, want_index_loss=True)
        loss = main_l + MTP_WEIGHT * mtp_l + index_l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.update_router_bias(ROUTER_BIAS_RATE)
        step += 1
        if step % 20 == 0:
            rec = {"step": step, "min": round((time.time() - t0) / 60, 2), "cpu_min": round(time.process_time() / 60, 2),
                   "lr": round(lr, 6),
                   "loss": round(main_l.item(), 4), "mtp": round(mtp_l.item(), 4),
                   "index_kl": round(index_l.item(), 4), "sparse": sparse}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    train_s = time.time() - t0
    ev = evaluate(model, windows, a.batch)
    ev.update({"steps": step, "train_seconds": round(train_s, 1), "process_cpu_seconds": round(time.process_time(), 1), "batch": a.batch, "seq": a.seq,
               "train_tokens": step * a.batch * a.seq, "device": a.device, "threads": a.threads})
    print("held-out:", json.dumps(ev), flush=True)

    export_hf(model.cpu(), a.out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(a.tokenizer_dir, name), os.path.join(a.out, name))
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump({"result": ev, "log": log}, f, indent=1)
        f.write("\n")
    print(f"exported {a.out}", flush=True)


if __name__ == "__main__":
    main()
