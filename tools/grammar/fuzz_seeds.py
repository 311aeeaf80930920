#!/usr/bin/env python3
"""Seed corpus and dictionary for the grammar compile fuzz target (tools/fuzz.sh SECONDS grammar_compile).

    fuzz_seeds.py grammar_compile CORPUS_DIR DICT_PATH

An input's first byte picks the kind (0 json_schema, 1 regex, 2 ebnf; bit 2 clears strict), the
rest is the grammar text. Seeds: the end-to-end test's corpus (tests/serve/structured_output_cases.py)
and its refused inputs.
"""
import json
import os
import sys

target, corpus, dict_path = sys.argv[1], sys.argv[2], sys.argv[3]
assert target == "grammar_compile", target
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "serve"))
import structured_output_cases as cases  # noqa: E402

os.makedirs(corpus, exist_ok=True)
for f in os.listdir(corpus):
    if f.startswith("seed_"):
        os.remove(os.path.join(corpus, f))
schemas, regexes, ebnfs = cases.corpus(n_random_schemas=20, n_random_regexes=10)
seeds = [bytes([0]) + json.dumps(s, ensure_ascii=False).encode() for s in schemas]
seeds += [bytes([1]) + r.encode() for r in regexes]
seeds += [bytes([2]) + g.encode() for g, _ in ebnfs]
kinds = {"json_schema": 0, "regex": 1, "ebnf": 2}
seeds += [bytes([kinds[f]]) + v.encode() for f, v, _ in cases.BAD if len(v) < 4000]
for i, b in enumerate(seeds):
    with open(os.path.join(corpus, f"seed_{i:03d}"), "wb") as f:
        f.write(b)

tokens = ['{"type":', '"object"', '"array"', '"string"', '"integer"', '"number"', '"boolean"', '"null"',
          '"properties":', '"required":', '"items":', '"prefixItems":', '"enum":', '"const":', '"anyOf":', '"oneOf":',
          '"allOf":', '"$ref":', '"#/$defs/', '"$defs":', '"additionalProperties":', '"minItems":', '"maxItems":',
          '"minLength":', '"maxLength":', '"pattern":', '"format":', '"minimum":', '"maximum":',
          '"exclusiveMinimum":', '"multipleOf":', "true", "false", "null", "{", "}", "[", "]", ",", ":",
          "(", ")", "|", "*", "+", "?", "{2,5}", "[a-z]", "[^", "\\d", "\\w", "\\s", "\\u00e9", "\\p{L}", ".",
          "(?:", "(?=", "::=", "root ::= ", "[^\\s\\S]", '"', "'", "#", "\\", "é", "日本", "\x00", "\xff"]


def esc(c):
    return {"\\": "\\\\", '"': '\\"'}.get(c, c if 32 <= ord(c) < 127 else "".join("\\x%02X" % b for b in c.encode()))


with open(dict_path, "w") as f:
    for t in tokens:
        f.write('"%s"\n' % "".join(esc(c) for c in t))
print(f"grammar_compile: {len(seeds)} seeds")
