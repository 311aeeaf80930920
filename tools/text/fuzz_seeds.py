#!/usr/bin/env python3
"""Seed corpus and dictionary for the text/ fuzz targets (tools/fuzz.sh --seeds NAME writes them to
fuzz/corpus/NAME/ and fuzz/dicts/NAME.dict, which are committed).

    python3 tools/text/fuzz_seeds.py tokenizer_json|chat_template|regex_scanner CORPUS_DIR DICT_FILE

tokenizer_json: u16 length + a small valid tokenizer.json cut from each test tokenizer of
tests/text/data (its first merges and the tokens they use) + a text to encode.
chat_template: the test templates (agentic/ included) and every Jinja probe of tests/text/data/templates.
regex_scanner: every golden text of the test tokenizers (all scripts, emoji, code, runs).
"""
import json
import os
import struct
import sys

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/text/data")


def template_ids(node):
    """Every id a post-processor's special_tokens list."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from (v if k == "ids" and isinstance(v, list) else template_ids(v))
    elif isinstance(node, list):
        for v in node:
            yield from template_ids(v)


def small_tokenizer(doc, n_merges=40):
    """The first merges of a tokenizer and the tokens they need (single characters and added
    tokens kept); a post-processor whose ids are gone is dropped."""
    merges = doc["model"]["merges"][:n_merges]
    keep = set()
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        keep |= {a, b, a + b}
    keep |= {t["content"] for t in doc["added_tokens"]}
    vocab = {t: i for t, i in doc["model"]["vocab"].items() if t in keep or len(t) == 1}
    doc["model"]["vocab"], doc["model"]["merges"] = vocab, merges
    if not set(template_ids(doc.get("post_processor"))) <= set(vocab.values()):
        doc["post_processor"] = None
    return doc


def tokenizer_seeds(corpus):
    texts = [b"Hello world, it's 2024!", "日本語 👍🏽 café\r\n\t  x".encode(), b"\xff\xfe<|im_start|>a\xe2\x82",
             b"<|endoftext|> <mask>  [single] 12345"]
    for name in sorted(os.listdir(DATA)):
        path = os.path.join(DATA, name, "tokenizer.json")
        if not os.path.exists(path):
            continue
        js = json.dumps(small_tokenizer(json.load(open(path, encoding="utf-8"))), ensure_ascii=False).encode()
        for k, text in enumerate(texts):
            with open(os.path.join(corpus, f"seed_{name}_{k}"), "wb") as f:
                f.write(struct.pack("<H", len(js)) + js + text)
    return ['"type"', '"Sequence"', '"Split"', '"ByteLevel"', '"Digits"', '"NFC"', '"NFKC"', '"Regex"', '"String"',
            '"pattern"', '"behavior"', '"Isolated"', '"Removed"', '"Contiguous"', '"MergedWithNext"',
            '"MergedWithPrevious"', '"invert"', '"pretokenizers"', '"normalizers"', '"add_prefix_space"', '"use_regex"',
            '"individual_digits"', '"TemplateProcessing"', '"single"', '"SpecialToken"', '"special_tokens"', '"ids"',
            '"added_tokens"', '"lstrip"', '"rstrip"', '"single_word"', '"normalized"', '"special"', '"content"',
            '"merges"', '"vocab"', '"unk_token"', '"fuse_unk"', '"ignore_merges"', '\\\\p{L}', '\\\\s+', '(?!\\\\S)',
            '[^\\\\s]', '\\\\u3040', 'true', 'false', 'null']


def template_seeds(corpus):
    tdir = os.path.join(DATA, "templates")
    for sub in ("", "agentic"):
        for name in sorted(os.listdir(os.path.join(tdir, sub))):
            if name.endswith(".jinja"):
                with open(os.path.join(tdir, sub, name), "rb") as src, \
                        open(os.path.join(corpus, "seed_" + (sub + "_" if sub else "") + name), "wb") as f:
                    f.write(src.read())
    # Templates that would allocate, write or loop without bound (issue 37): the fuzzer starts
    # from them so it keeps probing the interpreter's memory / output / step limits.
    hostile = {
        "nested_repeat": "{% set a=[0]*1000000 %}{% set b=[a]*60000 %}{{b|length}}",
        "big_output": "{{ 'x' * 60000000 }}",
        "copy_loop": "{% set a = 'x' * 1000000 %}{% for i in range(100000) %}{% set b = a ~ a %}{% endfor %}",
        "deep_nest": "{% set ns=namespace(a=[]) %}{% for i in range(100000) %}{% set ns.a = [ns.a] %}{% endfor %}{{ ns.a }}",
        "unique_n2": "{{ range(200000) | unique | length }}",
        "tojson_indent": "{{ messages | tojson(indent=100000000) }}",
    }
    for name, text in hostile.items():
        with open(os.path.join(corpus, "hostile_" + name), "wb") as f:
            f.write(text.encode())
    for p in json.load(open(os.path.join(tdir, "probes.json"), encoding="utf-8"))["probes"]:
        with open(os.path.join(corpus, "probe_" + p["name"]), "wb") as f:
            f.write(p["template"].encode())
    return ["{%", "%}", "{{", "}}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", "if", "elif", "else", "endif", "for", "in",
            "endfor", "set", "endset", "macro", "endmacro", "namespace(", "loop.index", "loop.last", "|", "tojson",
            "trim", "length", "selectattr", "items()", "is defined", "is string", "not", "and", "or", "messages",
            "message.content", "raise_exception(", "[::-1]", "break", "continue", "~", "**", "//", "'", "\"", "(", ")",
            "[", "]", ".", ",", "is mapping", "is not none", ".get(", ".split(", "ensure_ascii=False", "indent=",
            "tool_calls", "reasoning_content", "enable_thinking", "* 1000000", "[a] *"]


def scanner_seeds(corpus):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from corpus import CASES  # the texts every tokenizer golden is computed on
    for name, text in CASES:
        with open(os.path.join(corpus, "seed_" + name), "wb") as f:
            f.write(text)
    return ["'s", "'S", "'re", "'LL", "'\u017f", " ", "  ", "\t", "\r\n", "\n\n", "\x0b", "\u3000", "\u00a0",
            "\u0085", "\u2028", "\u180e", "123", "\u0661", "\u00b2", "\u2162", "\u0301", "\u65e5\u672c",
            "\u200d", "!", " !", "\U0001f44d", "\U0001123f"]


def main():
    target, corpus, dict_path = sys.argv[1:4]
    os.makedirs(corpus, exist_ok=True)
    seeds = {"tokenizer_json": tokenizer_seeds, "chat_template": template_seeds, "regex_scanner": scanner_seeds}
    tokens = seeds[target](corpus)
    with open(dict_path, "w") as f:
        for t in tokens:  # libFuzzer's syntax: \\, \" and \xHH escapes
            f.write('"%s"\n' % "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'\\"' else
                                        "\\" + chr(b) if b in b'\\"' else "\\x%02X" % b for b in t.encode()))


if __name__ == "__main__":
    main()
