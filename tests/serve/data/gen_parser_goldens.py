#!/usr/bin/env python3
"""Writes parser_goldens.json: texts and the outputs the reasoning and tool-call parsers must
give for them (tests/serve/parser_golden_test.cpp reads it). The expected outputs are computed
here, independently of the C++ parsers, from the rules SGLang's detectors follow: a call's
arguments are json.dumps(arguments, ensure_ascii=False) (SGLang's parse_base_json); a GLM value
whose schema type is string is verbatim, any other is json.loads'ed, falling back to the
string; a malformed or cut-off call stays content verbatim; a call to a function missing from
the tools is dropped; whitespace between content and a call (or a DeepSeek section marker) is
dropped. Run it from anywhere: python3 tests/serve/data/gen_parser_goldens.py
(`--fuzz-seeds CORPUS DICT` writes tools/fuzz.sh's seeds for tool_call_parser_fuzz instead)."""
import json
import os
import sys

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "date": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}, "limit": {"type": "integer"},
        "exact": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time"}},
    {"type": "function", "function": {"name": "set_mode", "parameters": {"type": "object", "properties": {
        "mode": {"enum": ["fast", "slow"]}, "level": {"type": ["string", "null"]},
        "value": {"anyOf": [{"type": "number"}, {"type": "string"}]}}}}},
]
NAMES = [t["function"]["name"] for t in TOOLS]
STRING_PARAMS = {("get_weather", "city"), ("get_weather", "date"), ("search", "query"), ("write_file", "path"),
                 ("write_file", "content"), ("set_mode", "mode")}  # set_mode.level is nullable: not a string

DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def dumps(v):
    return json.dumps(v, ensure_ascii=False)


def glm_value(name, key, raw):
    if (name, key) in STRING_PARAMS:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class Call:
    """A well-formed call: (name, [(key, raw value text)]) for GLM; (name, argument JSON text) for DeepSeek."""

    def __init__(self, name, args):
        self.name, self.args = name, args

    def glm(self, newlines):
        nl = "\n" if newlines else ""
        body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in self.args)
        return f"<tool_call>{self.name}{nl}{body}</tool_call>"

    def glm_expected(self):
        d = {}
        for k, v in self.args:
            d[k.strip()] = glm_value(self.name, k.strip(), v)
        return dumps(d)

    def ds(self, fenced):
        if fenced:
            return f"{DS_CALL_BEGIN}function{DS_SEP}{self.name}\n```json\n{self.args}\n```{DS_CALL_END}"
        return f"{DS_CALL_BEGIN}{self.name}{DS_SEP}{self.args}{DS_CALL_END}"

    def ds_expected(self):
        return dumps(json.loads(self.args))


def case(parser, text, content, calls):
    return {"parser": parser, "text": text, "content": content,
            "calls": [{"name": n, "tool_index": NAMES.index(n), "arguments": a} for n, a in calls]}


def glm_cases(parser):
    nl = parser == "glm45"
    W = Call("get_weather", [("city", "北京"), ("date", "2024-06-27")])
    S = Call("search", [("query", "moe kernels"), ("filters", '{"year": {"from": 2020, "to": [2024, 2025]}, "open": true}'),
                        ("limit", "10"), ("exact", "false"), ("tags", '["gpu", "fp4"]')])
    F = Call("write_file", [("path", "/tmp/a \"b\".txt"), ("content", "line1\nline2\t\\x\n  {\"not\": json}")])
    T = Call("get_time", [])
    J = Call("write_file", [("path", "123"), ("content", '{"a": 1}')])      # JSON-looking strings stay verbatim
    B = Call("search", [("query", "x"), ("limit", "ten"), ("filters", "{broken")])  # fallback to the string
    U = Call("search", [("query", "q"), ("unknown_key", "[1, 2.5, null]")])  # not in the schema: JSON
    M = Call("set_mode", [("mode", "fast"), ("level", "null"), ("value", "42")])
    E = Call("get_weather", [("city", "東京 🌸 é"), ("days", " 3 ")])
    K = Call("get_weather", [(" city ", "Paris")])                           # the key is trimmed
    X = Call("not_a_tool", [("a", "1")])
    g = lambda c: c.glm(nl)
    out = [
        case(parser, g(W), "", [("get_weather", W.glm_expected())]),
        case(parser, "Let me check the weather." + g(W), "Let me check the weather.", [("get_weather", W.glm_expected())]),
        case(parser, "Sure.\n\n" + g(W) + "\n", "Sure.", [("get_weather", W.glm_expected())]),
        case(parser, g(W) + g(T), "", [("get_weather", W.glm_expected()), ("get_time", "{}")]),
        case(parser, g(W) + "\n" + g(S) + "\n" + g(T), "", [("get_weather", W.glm_expected()), ("search", S.glm_expected()), ("get_time", "{}")]),
        case(parser, g(S), "", [("search", S.glm_expected())]),
        case(parser, g(F), "", [("write_file", F.glm_expected())]),
        case(parser, g(T), "", [("get_time", "{}")]),
        case(parser, g(J), "", [("write_file", J.glm_expected())]),
        case(parser, g(B), "", [("search", B.glm_expected())]),
        case(parser, g(U), "", [("search", U.glm_expected())]),
        case(parser, g(M), "", [("set_mode", M.glm_expected())]),
        case(parser, "天气如何？" + g(E), "天气如何？", [("get_weather", E.glm_expected())]),
        case(parser, g(K), "", [("get_weather", K.glm_expected())]),
        case(parser, g(X), "", []),
        case(parser, "A" + g(X) + " B " + g(T), "A B", [("get_time", "{}")]),
        case(parser, "\n" + g(W) + "\nDone.\n", "Done.", [("get_weather", W.glm_expected())]),
        case(parser, "  Hi " + g(T), "  Hi", [("get_time", "{}")]),  # SGLang strips to "Hi"
        case(parser, g(W) + "Done.", "Done.", [("get_weather", W.glm_expected())]),
        case(parser, "Before " + g(W) + " middle " + g(T) + " after", "Before  middle  after",
             [("get_weather", W.glm_expected()), ("get_time", "{}")]),
        case(parser, "No tools needed: 2 < 3 and <tools> are fine.", "No tools needed: 2 < 3 and <tools> are fine.", []),
        case(parser, "", "", []),
        case(parser, "trailing space  \n", "trailing space  \n", []),
        case(parser, "stray </tool_call> stays", "stray </tool_call> stays", []),
    ]
    # Cut off by the end of the text: the call stays content, verbatim.
    cut = g(W)[: len(g(W)) - 5]
    out.append(case(parser, "Checking. " + cut, "Checking. " + cut, []))
    out.append(case(parser, g(T) + "<tool_ca", "<tool_ca", [("get_time", "{}")]))
    out.append(case(parser, "<tool_call>get_weather", "<tool_call>get_weather", []))
    # Malformed: stays content (with the whitespace before it).
    bad1 = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</tool_call>"
    out.append(case(parser, "x " + bad1, "x " + bad1, []))
    bad2 = "<tool_call>get_weather<arg_key>city</arg_key>junk<arg_value>Rome</arg_value></tool_call>"
    out.append(case(parser, bad2 + g(T), bad2, [("get_time", "{}")]))
    bad3 = "<tool_call>get weather now</tool_call>"
    out.append(case(parser, bad3, bad3, []))
    bad4 = "<tool_call></tool_call>"
    out.append(case(parser, bad4, bad4, []))
    # A call that opens before the previous one closed: the first is unterminated.
    out.append(case(parser, "<tool_call>get_weather<arg_key>c" + g(T), "<tool_call>get_weather<arg_key>c", [("get_time", "{}")]))
    # A repeated key: the last value, at the first position (Python's dict).
    dup = Call("get_weather", [("city", "A"), ("date", "d"), ("city", "B")])
    out.append(case(parser, g(dup), "", [("get_weather", dumps({"city": "B", "date": "d"}))]))
    # A value containing tag-like text and a literal \n separator (GLM-4.5 outputs carry it).
    tagv = Call("write_file", [("path", "p"), ("content", "<arg_key>x</arg_key> <b>bold</b>")])
    out.append(case(parser, g(tagv), "", [("write_file", tagv.glm_expected())]))
    lit = "<tool_call>get_weather\\n<arg_key>city</arg_key>\\n<arg_value>Oslo</arg_value>\\n</tool_call>"
    out.append(case(parser, lit, "", [("get_weather", dumps({"city": "Oslo"}))]))
    # SGLang's Glm47MoeDetector docstring example (two calls, no newlines).
    doc = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value><arg_key>date</arg_key>"
           "<arg_value>2024-06-27</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key>"
           "<arg_value>上海</arg_value><arg_key>date</arg_key><arg_value>2024-06-27</arg_value></tool_call>")
    out.append(case(parser, doc, "", [("get_weather", '{"city": "北京", "date": "2024-06-27"}'),
                                      ("get_weather", '{"city": "上海", "date": "2024-06-27"}')]))
    return out


def ds_cases(parser):
    fenced = parser == "deepseekv3"
    W = Call("get_weather", '{"city": "Tokyo", "days": 3}')
    S = Call("search", '{"query": "ünïcode ✓", "filters": {"a": [1, 2.5, {"b": null}], "c": true}, "limit": 1e3}')
    T = Call("get_time", "{}")
    Q = Call("write_file", '{"path": "x", "content": "a \\"quoted\\" \\\\ line\\nnext"}')
    X = Call("not_a_tool", '{"a": 1}')
    c = lambda call: call.ds(fenced)
    blk = lambda *calls, sep="": DS_CALLS_BEGIN + sep.join(c(x) for x in calls) + DS_CALLS_END
    out = [
        case(parser, blk(W), "", [("get_weather", W.ds_expected())]),
        case(parser, "Let me look." + blk(W), "Let me look.", [("get_weather", W.ds_expected())]),
        case(parser, "Let me look.\n\n" + blk(W, T, sep="\n"), "Let me look.", [("get_weather", W.ds_expected()), ("get_time", "{}")]),
        case(parser, blk(W, S, T), "", [("get_weather", W.ds_expected()), ("search", S.ds_expected()), ("get_time", "{}")]),
        case(parser, blk(S), "", [("search", S.ds_expected())]),
        case(parser, blk(Q), "", [("write_file", Q.ds_expected())]),
        case(parser, blk(T), "", [("get_time", "{}")]),
        case(parser, blk(X), "", []),
        case(parser, blk(X, W), "", [("get_weather", W.ds_expected())]),
        case(parser, c(W), "", [("get_weather", W.ds_expected())]),  # no section markers
        case(parser, blk(W) + "\nAnything else?", "Anything else?", [("get_weather", W.ds_expected())]),
        case(parser, "中文内容 " + blk(T), "中文内容", [("get_time", "{}")]),
        case(parser, "Plain answer, no tools.", "Plain answer, no tools.", []),
        case(parser, "", "", []),
        case(parser, DS_CALLS_BEGIN + DS_CALLS_END, "", []),
        case(parser, "a " + DS_CALLS_BEGIN + " b", "a  b", []),
        case(parser, "look: <｜tool▁ca", "look: <｜tool▁ca", []),
        case(parser, "text <｜tool▁calls▁beg", "text <｜tool▁calls▁beg", []),
        case(parser, "Result:\n```python\nprint(1)\n```", "Result:\n```python\nprint(1)\n```", []),
        case(parser, blk(W, T, sep="\n\n  ") + "  ", "", [("get_weather", W.ds_expected()), ("get_time", "{}")]),
    ]
    nested = Call("search", '{"filters": ' + "[" * 40 + "1" + "]" * 40 + "}")
    out.append(case(parser, blk(nested), "", [("search", nested.ds_expected())]))
    # Cut off: the open call stays content (its section marker is dropped).
    cut = c(W)[:-7]
    out.append(case(parser, DS_CALLS_BEGIN + cut, cut, []))
    out.append(case(parser, DS_CALLS_BEGIN + c(T) + cut, cut, [("get_time", "{}")]))
    # Malformed arguments / shape: the call stays content.
    bad_json = Call("get_weather", '{"city": "Tokyo",}')
    out.append(case(parser, blk(bad_json, T), c(bad_json), [("get_time", "{}")]))
    not_obj = Call("get_weather", '[1, 2]')
    out.append(case(parser, blk(not_obj), c(not_obj), []))
    no_sep = f"{DS_CALL_BEGIN}get_weather {{}}{DS_CALL_END}"
    out.append(case(parser, DS_CALLS_BEGIN + no_sep + DS_CALLS_END, no_sep, []))
    deep = Call("search", "[" * 80 + "]" * 80)
    out.append(case(parser, blk(deep), c(deep), []))
    reopen = DS_CALL_BEGIN + "get_wea"
    out.append(case(parser, DS_CALLS_BEGIN + reopen + c(T) + DS_CALLS_END, reopen, [("get_time", "{}")]))
    if fenced:
        nofence = f"{DS_CALL_BEGIN}function{DS_SEP}get_weather\n{{\"city\": \"x\"}}{DS_CALL_END}"
        out.append(case(parser, DS_CALLS_BEGIN + nofence + DS_CALLS_END, nofence, []))
        plain = f"{DS_CALL_BEGIN}function{DS_SEP}get_time\n```\n{{}}\n```{DS_CALL_END}"
        out.append(case(parser, DS_CALLS_BEGIN + plain + DS_CALLS_END, "", [("get_time", "{}")]))
        # SGLang's DeepSeekV3Detector docstring example.
        doc = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_current_weather\n```json\n"
               "{\"location\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
               "get_current_weather\n```json\n{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    else:
        empty = f"{DS_CALL_BEGIN}get_time{DS_SEP}{DS_CALL_END}"
        out.append(case(parser, DS_CALLS_BEGIN + empty + DS_CALLS_END, "", [("get_time", "{}")]))
        spaced = f"{DS_CALL_BEGIN} get_weather {DS_SEP}\n{{\"city\":\"Lyon\"}}\n{DS_CALL_END}"
        out.append(case(parser, DS_CALLS_BEGIN + spaced + DS_CALLS_END, "", [("get_weather", '{"city": "Lyon"}')]))
        # SGLang's DeepSeekV31Detector docstring example.
        doc = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_current_weather<｜tool▁sep｜>{\"location\": \"Tokyo\"}"
               "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_current_weather<｜tool▁sep｜>{\"location\": \"Paris\"}"
               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    # The docstring's function is not in TOOLS: with the tools below it is dropped; the test
    # file's "doc_tools" case adds it (see doc_cases).
    out.append(case(parser, doc, "", []))
    out.append({"parser": parser, "text": doc, "content": "", "extra_tool": "get_current_weather",
                "calls": [{"name": "get_current_weather", "tool_index": len(NAMES), "arguments": '{"location": "Tokyo"}'},
                          {"name": "get_current_weather", "tool_index": len(NAMES), "arguments": '{"location": "Paris"}'}]})
    return out


def reasoning_cases():
    out = []

    def r(parser, _so, text, reasoning, content):
        out.append({"parser": parser, "starts_open": given, "text": text, "reasoning": reasoning, "content": content})

    for p in ["glm45", "deepseek-r1", "deepseek-v3"]:
        tool_ends = p != "deepseek-r1"
        for given in [True, False]:
            so = given or p == "deepseek-r1"  # SGLang's deepseek-r1 detector always starts open
            closed_plain = ("", "The answer is 42.") if not so else ("The answer is 42.", "")
            r(p, so, "<think>Let me think.</think>The answer is 42.", "Let me think.", "The answer is 42.")
            r(p, so, "\n<think>\nstep 1\nstep 2\n</think>\n\nAnswer.", "\nstep 1\nstep 2\n", "\n\nAnswer.")
            r(p, so, "The answer is 42.", closed_plain[0], closed_plain[1])
            r(p, so, "", "", "")
            r(p, so, "<think>cut off by max_tokens", "cut off by max_tokens", "")
            r(p, so, "<think>partial close </thi", "partial close </thi", "")
            r(p, so, "<think></think>", "", "")
            r(p, so, "<think>思考 🤔</think>答案：北京", "思考 🤔", "答案：北京")
            r(p, so, "<think>a < b and </thinking> is not the tag</think>done", "a < b and </thinking> is not the tag", "done")
            r(p, so, "<thi", *(("<thi", "") if so else ("", "<thi")))
            r(p, so, "  <think>x</think>y", "x", "y")
            r(p, so, "<think>x</think>y</think>z", "x", "y</think>z")
            r(p, so, "<think>x</think><think>y</think>", "x", "<think>y</think>")
            if so:
                r(p, so, "Reasoning without tags</think>Content", "Reasoning without tags", "Content")
                r(p, so, "r1 style\n</think>\n\nfinal", "r1 style\n", "\n\nfinal")
                r(p, so, "no close at all", "no close at all", "")
            else:
                r(p, so, "Content that mentions <think> later", "", "Content that mentions <think> later")
                r(p, so, "Plain</think>text", "", "Plain</think>text")
                r(p, so, "x<think>y</think>", "", "x<think>y</think>")
            call = "<tool_call>get_time</tool_call>"
            if tool_ends:
                r(p, so, "<think>I need the time" + call, "I need the time", call)
            else:
                r(p, so, "<think>I need the time" + call, "I need the time" + call, "")
    return out


def fuzz_seeds(corpus, dict_path):
    """tools/fuzz.sh's seeds for fuzz/tool_call_parser_fuzz.cpp: byte 0 picks the parsers (or,
    from 0xF0, an endpoint), byte 1 seeds the cut points, the rest is the text (or body)."""
    os.makedirs(corpus, exist_ok=True)
    tool_modes = {"glm47": 0, "glm45": 1, "deepseekv3": 2, "deepseekv31": 3}
    reasoning_modes = {"glm45": 0, "deepseek-r1": 4, "deepseek-v3": 8}
    seeds = [bytes([tool_modes[c["parser"]], i % 256]) + c["text"].encode() for i, c in enumerate(glm_cases("glm47") + glm_cases("glm45") + ds_cases("deepseekv3") + ds_cases("deepseekv31"))]
    seeds += [bytes([reasoning_modes[c["parser"]] + (12 if c["starts_open"] else 0), i % 256]) + c["text"].encode()
              for i, c in enumerate(reasoning_cases())]
    seeds.append(bytes([0xF0, 0]) + dumps({"text": "<tool_call>get_time</tool_call>", "tool_call_parser": "glm47", "tools": TOOLS}).encode())
    seeds.append(bytes([0xF1, 0]) + dumps({"text": "<think>a</think>b", "reasoning_parser": "glm45"}).encode())
    for i, s in enumerate(seeds):
        with open(os.path.join(corpus, f"seed_{i}"), "wb") as f:
            f.write(s)
    tokens = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "\\n", "get_weather",
              "get_time", "city", "days", "<think>", "</think>", DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END,
              DS_SEP, "function", "```json\n", "\n```", "{", "}", "[", "]", '"', '"tools"', '"text"', '"tool_call_parser"']
    with open(dict_path, "w") as f:
        for t in tokens:  # libFuzzer's syntax: \\, \" and \xHH escapes
            f.write('"%s"\n' % "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'\\"' else
                                        "\\" + chr(b) if b in b'\\"' else "\\x%02X" % b for b in t.encode()))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--fuzz-seeds":
        return fuzz_seeds(sys.argv[2], sys.argv[3])
    here = os.path.dirname(os.path.abspath(__file__))
    goldens = {"tools": TOOLS, "tool_calls": [], "reasoning": reasoning_cases()}
    for p in ["glm47", "glm45"]:
        goldens["tool_calls"] += glm_cases(p)
    for p in ["deepseekv3", "deepseekv31"]:
        goldens["tool_calls"] += ds_cases(p)
    with open(os.path.join(here, "parser_goldens.json"), "w", encoding="utf-8") as f:
        json.dump(goldens, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for p in ["glm47", "glm45", "deepseekv3", "deepseekv31"]:
        print(p, sum(1 for c in goldens["tool_calls"] if c["parser"] == p))
    for p in ["glm45", "deepseek-r1", "deepseek-v3"]:
        print(p, sum(1 for c in goldens["reasoning"] if c["parser"] == p))


if __name__ == "__main__":
    main()
