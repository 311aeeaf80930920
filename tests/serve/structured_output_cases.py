"""The structured-output corpus: JSON schemas, regexes and EBNF grammars (issue 42).

Hand-written nasty cases (deep nesting, unicode, escapes, numbers at their limits, enums of
multi-token strings, $ref/$defs, anyOf, formats) plus seeded random schemas and regexes, so
that the end-to-end test runs well over 200 constrained requests. Every schema here must be
satisfiable and every regex must match something; `BAD` lists inputs the server must refuse.
"""
import json
import random

# Python's `re` and xgrammar agree on these (no lookaround, no backreferences, no anchors).
REGEXES = [
    r"abc", r"(ab|cd)*e", r"[a-z]{2,5}", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r"(true|false|null)", r"\d{3}-\d{4}", r"x*", r"(alpha|beta|gamma)( (alpha|beta|gamma)){0,3}",
    r"é+€?", r"a{0,2}b{1,}c?", r"\w+@\w+\.(com|org|net)", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}",
    r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}",
    r"(\+|-)?\d{1,3}(,\d{3}){0,2}", r"https?://[a-z]{1,10}\.(com|io)(/[a-z0-9]{1,6}){0,3}",
    r"日本語|中文|한국어", r"[αβγδ]{1,4}", r"(yes|no|maybe)", r"\(\d{3}\) \d{3}-\d{4}",
    r"[01]{8}", r"#[0-9A-Fa-f]{6}", r"v\d+\.\d+\.\d+(-rc\d)?", r"\[\d(,\d){0,4}\]",
    r"\"[a-z]{0,6}\"", r"(a|b)*abb", r"[ -~]{1,12}", r"(0|[1-9]\d{0,2})(\.(0|[1-9]\d{0,2})){3}",
    r"[a-z]+(_[a-z]+)*", r"\{\"k\":\d{1,3}\}", r"😀{1,3}", r"(ab){2,4}c{0,1}", r"\s?x\s?",
    r"[+*/-]{1,3}", r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun)day?", r"\\n|\\t", r"(?:aa|bb)+", r"[.?!]{1,3}",
]

EBNFS = [
    ('root ::= item ("," item)*\nitem ::= "ab" | "xyz"', r"(ab|xyz)(,(ab|xyz))*"),
    ('root ::= "(" root ")" | "x"', lambda t: (len(t) % 2 == 1 and t == "(" * (len(t) // 2) + "x" + ")" * (len(t) // 2))),
    ('root ::= [a-c]+ "=" [0-9]+', r"[a-c]+=[0-9]+"),
    ('root ::= "yes" | "no"', r"yes|no"),
    ('root ::= num ("+" num)*\nnum ::= [1-9] [0-9]*', r"[1-9][0-9]*(\+[1-9][0-9]*)*"),
]

S = {"type": "string", "maxLength": 12}

SCHEMAS = [
    {"type": "object"},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "string", "maxLength": 20},
    {"type": "integer", "minimum": -5, "maximum": 5},
    {"type": "integer", "minimum": 9007199254740990, "maximum": 9007199254740993},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000},
    {"type": "number", "minimum": -1.5, "maximum": 1.5},
    {"type": "number"},
    {"type": "integer", "minimum": -2147483648, "maximum": -2147483640},
    {"type": "boolean"},
    {"type": "null"},
    {"const": "a \"quoted\" \\ back\nslash"},
    {"const": {"nested": [1, "two", None, True]}},
    {"enum": ["alpha beta gamma delta", "epsilon zeta", "η θ ι", "🙂 smile", ""]},
    {"enum": [1, 2.5, "x", None, False, [1, 2], {"k": "v"}]},
    {"type": "object", "properties": {"naïve": {"enum": ["café", "日本", "Zürich"]}, "ключ": {"type": "boolean"}},
     "required": ["naïve", "ключ"], "additionalProperties": False},
    {"type": "object", "properties": {"a\"b": {"type": "integer"}, "c\\d": {"type": "null"}, "e\nf": S},
     "required": ["a\"b", "c\\d", "e\nf"]},
    {"type": "string", "minLength": 3, "maxLength": 3},
    {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "date-time"},
    {"type": ["string", "null"], "maxLength": 5},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}, {"type": "null"}]},
    {"type": "array", "items": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}, "maxItems": 6},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"const": "x"}], "items": False},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                          "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                        "required": ["v", "next"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"opt1": S, "opt2": {"type": "integer"}, "req": {"type": "boolean"}},
     "required": ["req"], "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "minItems": 2, "maxItems": 2},
    {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}, "uniqueItems": False, "maxItems": 4},
    {"type": "object", "patternProperties": {"^[a-c]{1,3}$": {"type": "integer"}}, "additionalProperties": False,
     "maxProperties": 3},
    {"type": "object", "propertyNames": {"pattern": "^[xyz]{1,2}$"}, "additionalProperties": {"type": "boolean"},
     "minProperties": 1, "maxProperties": 4},
    {"type": "integer", "multipleOf": 7, "minimum": -100, "maximum": 100},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"]}]},
    # Tool-call argument schemas (the workload of the mask benchmark).
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "unit": {"enum": ["celsius", "fahrenheit"]},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 14}},
     "required": ["city", "unit", "days"], "additionalProperties": False},
    {"type": "object", "properties": {"query": {"type": "string", "maxLength": 30},
                                      "filters": {"type": "array", "maxItems": 3, "items": {
                                          "type": "object", "properties": {"field": {"enum": ["date", "author"]},
                                                                           "value": S},
                                          "required": ["field", "value"], "additionalProperties": False}},
                                      "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
     "required": ["query"], "additionalProperties": False},
]


def _nest_objects(depth):
    s = {"type": "integer", "minimum": 0, "maximum": 9}
    for i in range(depth):
        s = {"type": "object", "properties": {f"l{i}": s}, "required": [f"l{i}"], "additionalProperties": False}
    return s


def _nest_arrays(depth):
    s = {"type": "boolean"}
    for _ in range(depth):
        s = {"type": "array", "items": s, "minItems": 1, "maxItems": 2}
    return s


SCHEMAS += [_nest_objects(d) for d in (2, 5, 8, 11)]
SCHEMAS += [_nest_arrays(d) for d in (2, 4, 6)]


def random_schema(rng, depth=0):
    """A satisfiable schema whose every string is bounded (outputs end under a uniform model)."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 3:
        kinds += ["object", "object", "array"]
    k = rng.choice(kinds)
    if k == "string":
        lo = rng.randint(0, 4)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 10)}
    if k == "integer":
        lo = rng.choice([-(2 ** 31), -1000, -1, 0, 7, 2 ** 40])
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([0, 1, 9, 500, 2 ** 20])}
    if k == "number":
        return {"type": "number", "minimum": rng.choice([-10, 0, 0.5]), "maximum": rng.choice([10, 100.25])}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "null":
        return {"type": "null"}
    if k == "enum":
        words = ["alpha", "beta gamma", "δέλτα", "x\"y", "back\\slash", "tab\there", "", "long enum value number 7"]
        return {"enum": rng.sample(words, rng.randint(1, 4))}
    if k == "const":
        return {"const": rng.choice([0, -1, 3.5, "c", True, None, [1], {"z": 0}])}
    if k == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 3)}
    props = {}
    for i in range(rng.randint(1, 4)):
        name = rng.choice(["id", "name", "välue", "x y", "q\"t", f"p{i}", "🔑"]) + str(i)
        props[name] = random_schema(rng, depth + 1)
    req = [n for n in props if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": req, "additionalProperties": False}


def random_regex(rng):
    atoms = [r"[a-z]", r"\d", r"(ab|cd)", r"[A-F0-9]", r"é", r"x", r"(\.|-)", r"[αω]"]
    parts = []
    for _ in range(rng.randint(1, 4)):
        a = rng.choice(atoms)
        q = rng.choice(["", "?", "{1,3}", "{2}", "+"])
        parts.append(a + q)
    return "".join(parts)


def corpus(n_random_schemas=150, n_random_regexes=30, seed=42):
    rng = random.Random(seed)
    schemas = SCHEMAS + [random_schema(rng) for _ in range(n_random_schemas)]
    regexes = REGEXES + [random_regex(rng) for _ in range(n_random_regexes)]
    return schemas, regexes, EBNFS


# Inputs the server must refuse with a 400 (and stay healthy): (field, value, why).
BAD = [
    ("json_schema", '{"type": ', "not JSON"),
    ("json_schema", json.dumps({"type": "frobnicate"}), "an unknown type"),
    ("json_schema", json.dumps({"type": "string", "minLength": 5, "maxLength": 2}), "unsatisfiable bounds"),
    ("json_schema", json.dumps(_nest_arrays(40)), "over the nesting limit"),
    ("json_schema", json.dumps({"enum": ["x" * 40000]}), "over the size limit"),
    ("json_schema", json.dumps({"not": {"type": "string"}}), "an unsupported keyword (not)"),
    ("json_schema", json.dumps({"type": "array", "contains": {"type": "integer"}}), "an unsupported keyword (contains)"),
    ("json_schema", json.dumps({"oneOf": [{"type": "integer"}, {"type": "number"}]}), "oneOf"),
    ("json_schema", json.dumps({"allOf": [{"type": "integer"}, {"minimum": 3}]}), "allOf of two"),
    ("json_schema", json.dumps({"type": "array", "uniqueItems": True}), "uniqueItems"),
    ("json_schema", json.dumps({"type": "number", "multipleOf": 0.5}), "multipleOf on a number"),
    ("json_schema", json.dumps({"type": "string", "pattern": "a+", "maxLength": 3}), "pattern with a length"),
    ("json_schema", json.dumps({"$ref": "https://example.com/s.json"}), "an external $ref"),
    ("json_schema", json.dumps({"$ref": "#/$defs/missing"}), "a dangling $ref"),
    ("json_schema", json.dumps({"type": "object", "properties": {"a": {"if": {}, "then": {}}}}), "nested if/then"),
    ("regex", "(ab", "unbalanced"),
    ("regex", r"[^\s\S]", "matches nothing"),
    ("regex", "a{3,1}", "a bad repeat"),
    ("regex", r"a[^\s\S]", "a dead end after text (the start allows 'a')"),
    ("regex", r"ok|x(y|z[^\s\S])", "a dead branch that text can enter"),
    ("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "string", "pattern": "x[^\\s\\S]"}},
                                "required": ["a"]}), "a pattern that matches nothing, after text"),
    ("ebnf", 'root ::= "b" | "a" x\nx ::= "c" x', "a rule without a finite derivation"),
    ("ebnf", 'root ::= "a" | ', "a syntax error"),
    ("ebnf", 'start ::= "a"', "no root rule"),
]
