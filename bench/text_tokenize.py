#!/usr/bin/env python3
"""Tokenizer encoding speed: fp4moe (C++) against Hugging Face tokenizers (Python, one
thread) on the same mixed-language corpus, with an identity check of all ids.

    python3 bench/text_tokenize.py [--fp4moe build/bin/fp4moe] [--out build/bench_text] [--mb 8]

Writes OUT/corpus.json (a deterministic mix: English-like prose with a Zipfian vocabulary,
Chinese, Japanese, Korean, Arabic, Hindi, Russian, emoji with ZWJ sequences and skin tones,
code with tabs and CRLF, long digit and space runs), trains a 64k byte-level BPE in the GLM
style on a different sample (OUT/bench_tokenizer/), then for that tokenizer and the small
test tokenizers of tests/text/data measures both implementations single-threaded and prints
a Markdown table: MB per CPU second (the dev machines are shared, so wall time would measure
the neighbours), ratio, and whether the ids hash equal.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

GLM_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def zipf_choice(rng, items, s=1.1):
    # Rank r drawn with probability ~ 1/r^s (inverse CDF over a precomputed table).
    key = (id(items), s)
    if key not in zipf_choice.cache:
        weights = [1.0 / (r + 1) ** s for r in range(len(items))]
        total, acc, cdf = sum(weights), 0.0, []
        for w in weights:
            acc += w / total
            cdf.append(acc)
        zipf_choice.cache[key] = cdf
    cdf = zipf_choice.cache[key]
    x = rng.random()
    lo, hi = 0, len(cdf) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cdf[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return items[lo]


zipf_choice.cache = {}


class Corpus:
    def __init__(self, seed):
        rng = random.Random(seed)
        self.rng = rng
        syll = [c + v for c in "bcdfghjklmnprstvwyz" for v in ["a", "e", "i", "o", "u", "ai", "ou", "ee"]]
        common = ("the of and to in is that it for was on are as with his they at be this from have or by one had "
                  "not but what all were when we there can an your which their said if do will each about how up out "
                  "them then she many some so these would other into has more her two like him see time could no make "
                  "than first been its who now people my made over did down only way find use may water long little "
                  "very after words called just where most know model token expert kernel memory server request").split()
        words = set(common)
        while len(words) < 30000:
            words.add("".join(rng.choice(syll) for _ in range(rng.choice([1, 2, 2, 3, 3, 4]))))
        self.en = common + sorted(words - set(common))
        self.zh = [chr(c) for c in range(0x4E00, 0x4E00 + 3500)]
        self.hira = [chr(c) for c in range(0x3041, 0x3097)]
        self.kata = [chr(c) for c in range(0x30A1, 0x30FB)]
        self.ko = [chr(0xAC00 + rng.randrange(11172)) for _ in range(2500)]
        self.ar = [chr(c) for c in range(0x0621, 0x064B)]
        self.hi = [chr(c) for c in range(0x0915, 0x0939)] + ["ा", "ि", "ी", "ु", "े", "ो", "ं", "्"]
        self.ru = [chr(c) for c in range(0x0430, 0x0450)]
        self.emoji = ["👍🏽", "👋🏿", "🙌🏻", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇯🇵", "❤️", "😀", "🎉", "🚀", "1️⃣", "🧑‍🤝‍🧑"]

    def english(self, n):
        rng, out = self.rng, []
        for _ in range(n):
            sent = [zipf_choice(rng, self.en) for _ in range(rng.randint(4, 18))]
            sent[0] = sent[0].capitalize()
            if rng.random() < 0.2:
                sent.insert(rng.randrange(len(sent)), str(rng.randint(0, 10 ** rng.randint(1, 6))))
            if rng.random() < 0.15:
                sent.insert(rng.randrange(len(sent)), rng.choice(["don't", "it's", "we'll", "they're", "I'm"]))
            out.append(" ".join(sent) + rng.choice([".", ".", ".", "?", "!", ",", ";", ":"]))
        return " ".join(out)

    def chars(self, pool, n, sep="", punct="，。、！？"):
        rng = self.rng
        return sep.join(zipf_choice(rng, pool, 0.9) + (rng.choice(punct) if rng.random() < 0.06 else "")
                        for _ in range(n))

    def words_of(self, alphabet, n, lo=2, hi=8):
        rng = self.rng
        return " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n))

    def japanese(self, n):
        rng, out = self.rng, []
        for _ in range(n):
            kind = rng.random()
            pool = self.zh if kind < 0.4 else self.hira if kind < 0.8 else self.kata
            out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 5))))
            if rng.random() < 0.1:
                out.append("。")
        return "".join(out)

    def code(self, n):
        rng, lines = self.rng, []
        nl = "\r\n" if rng.random() < 0.3 else "\n"
        for _ in range(n):
            ind = "\t" * rng.randint(0, 3) if rng.random() < 0.5 else "    " * rng.randint(0, 3)
            a, b = zipf_choice(rng, self.en), zipf_choice(rng, self.en)
            lines.append(ind + rng.choice([
                f"def {a}_{b}(x, y=None):", f"for (int i = 0; i < {a}.size(); ++i) {{", f"return {a}[{rng.randint(0, 99)}] * {b};",
                f"{a} = {{'{b}': {rng.random():.4f}, 'n': {rng.randint(0, 9999)}}}", f"// TODO({a}): {b} later",
                f"if {a} is not None and {b} >= 0x{rng.randint(0, 65535):04X}:", "}", f"print(f\"{{{a}!r}}\")"]))
        return nl.join(lines) + nl

    def misc(self):
        rng = self.rng
        return rng.choice([
            " ".join(str(rng.randint(0, 10 ** 12)) for _ in range(rng.randint(5, 40))),
            "".join(rng.choice("0123456789") for _ in range(rng.randint(50, 400))),
            " " * rng.randint(10, 200) + "x" + "\n" * rng.randint(2, 30),
            " ".join(rng.choice(self.emoji) for _ in range(rng.randint(5, 40))),
        ])

    def document(self):
        rng = self.rng
        parts, size = [], rng.randint(1000, 8000)
        total = 0
        while total < size:
            r = rng.random()
            if r < 0.40:
                p = self.english(rng.randint(1, 6))
            elif r < 0.55:
                p = self.code(rng.randint(3, 20))
            elif r < 0.67:
                p = self.chars(self.zh, rng.randint(20, 200))
            elif r < 0.73:
                p = self.japanese(rng.randint(10, 80))
            elif r < 0.78:
                p = self.chars(self.ko, rng.randint(10, 60), sep=" ", punct=".,")
            elif r < 0.82:
                p = self.words_of(self.ar, rng.randint(5, 30))
            elif r < 0.86:
                p = self.words_of(self.hi, rng.randint(5, 30))
            elif r < 0.90:
                p = self.words_of(self.ru, rng.randint(5, 30)).capitalize() + "."
            else:
                p = self.misc()
            parts.append(p)
            total += len(p.encode())
        return "\n\n".join(parts)

    def make(self, mb):
        docs, total = [], 0
        while total < mb * 1e6:
            d = self.document()
            docs.append(d)
            total += len(d.encode())
        return docs


def fnv1a(ids_iter):
    h = 0xcbf29ce484222325
    for ids in ids_iter:
        for i in ids:
            h = ((h ^ i) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def bench_python(tok_path, docs, reps):
    # CPU seconds of this process (one thread does the work): the dev machines are shared.
    tok = Tokenizer.from_file(tok_path)
    best, cold, all_ids = None, None, None
    for _ in range(reps):
        t0 = time.process_time()
        ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        dt = time.process_time() - t0
        cold = dt if cold is None else cold
        best = dt if best is None else min(best, dt)
        all_ids = ids
    return cold, best, fnv1a(all_ids), sum(len(i) for i in all_ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4moe", default="build/bin/fp4moe")
    ap.add_argument("--out", default="build/bench_text")
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    corpus_path = os.path.join(args.out, "corpus.json")
    docs = Corpus(seed=2026).make(args.mb)
    with open(corpus_path, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    nbytes = sum(len(d.encode()) for d in docs)

    tok_dir = os.path.join(args.out, "bench_tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        os.makedirs(tok_dir, exist_ok=True)
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GLM_REGEX), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=64000, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=["<|endoftext|>", "<|user|>", "<|assistant|>"])
        t0 = time.perf_counter()
        tok.train_from_iterator(Corpus(seed=7).make(min(args.mb, 6.0)), trainer)
        tok.save(os.path.join(tok_dir, "tokenizer.json"))
        print(f"trained the bench tokenizer in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    folders = [("bench_64k_glm_style", tok_dir)] + [
        (n, os.path.join("tests/text/data", n)) for n in ("glm_style", "qwen_style", "deepseek_style")]
    rows = []
    for name, folder in folders:
        cold_py, best_py, hash_py, ntok_py = bench_python(os.path.join(folder, "tokenizer.json"), docs, max(1, args.reps - 1))
        res = subprocess.run([args.fp4moe, "bench", "tokenize", folder, "--corpus", corpus_path, "--reps",
                              str(args.reps)], check=True, capture_output=True, text=True)
        ours = json.loads(res.stdout)
        rows.append((name, nbytes / best_py / 1e6, ours["cold_mb_per_cpu_s"], ours["best_mb_per_cpu_s"],
                     ours["best_mb_per_cpu_s"] / (nbytes / best_py / 1e6), ours["ids_fnv1a"] == hash_py and
                     ours["tokens"] == ntok_py, ntok_py))
    print(f"corpus: {len(docs)} documents, {nbytes / 1e6:.2f} MB (bench/text_tokenize.py, seed 2026)\n")
    print("MB per CPU second of the encoding thread (process CPU time for Python; the machine is shared)\n")
    print("| tokenizer | tokenizers (Python, 1 thread) MB/s | fp4moe cold MB/s | fp4moe warm MB/s | warm / tokenizers | ids identical | tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, py, cold, warm, ratio, same, ntok in rows:
        print(f"| {name} | {py:.2f} | {cold:.1f} | {warm:.1f} | {ratio:.1f}x | {'yes' if same else 'NO'} | {ntok} |")


if __name__ == "__main__":
    main()
