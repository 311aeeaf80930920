#!/usr/bin/env python3
"""tool_choice "required" and a named function end to end (issue 42, item 3).

`fp4moe serve --backend fake --fake-uniform-logits --tool-call-parser glm47|glm45` (every
allowed token equally likely, so outputs wander through the whole tool-call grammar) answers
chat requests over seeded random tool sets (nested object arguments, enums of multi-token strings
with quotes / unicode / newlines, arrays, bounded numbers, raw and JSON strings) through the
real `openai` client. Every reply that finishes has `finish_reason: "tool_calls"`, no content,
and calls whose names are tools (the named one, exactly once, for a named choice; one call with
parallel_tool_calls false) and whose arguments parse and validate with `jsonschema` against the
tool's parameters; a reply that does not finish used all of max_tokens. Streaming assembles to
calls that validate too. Bad cases are a 400 with the parameter named, and the server stays
healthy: no --tool-call-parser, a deepseek parser, a parameter the glm encoding cannot keep
exact, tool_choice next to response_format, "required" without tools.

    tool_choice_e2e_test.py PATH/TO/fp4moe
"""
import concurrent.futures as cf
import json
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openai_e2e_test as e2e  # noqa: E402  (ServerProcess)
from tool_calls_e2e_test import assemble  # noqa: E402

try:
    import jsonschema
except ImportError:  # setup.sh --deps installs it
    sys.exit("jsonschema is not installed (setup.sh --deps installs the pinned version): this test needs it")

MAX_TOKENS = 1200
MESSAGES = [{"role": "user", "content": "call a tool"}]
NO_PARAMETERS = {"type": "object", "properties": {}}

ENUM_STRINGS = ['say "hi"', "naïve café", "two\nlines", "日本語", "a\\b", "<b>bold</b>", "tab\there", "😀 ok"]


def random_value_schema(rng, depth):
    """A schema for a value nested inside JSON (strings here are JSON strings)."""
    kinds = ["int", "num", "bool", "str", "enum", "null_or_int"] + (["array", "object"] if depth < 3 else [])
    k = rng.choice(kinds)
    if k == "int":
        lo = rng.randint(-1000, 10)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 2000)}
    if k == "num":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if k == "bool":
        return {"type": "boolean"}
    if k == "str":
        return {"type": "string", "maxLength": rng.randint(0, 8)}
    if k == "enum":
        return {"enum": rng.sample(ENUM_STRINGS, rng.randint(1, 4))}
    if k == "null_or_int":
        return {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]}
    if k == "array":
        return {"type": "array", "items": random_value_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    return random_object_schema(rng, depth + 1, nested=True)


def random_object_schema(rng, depth, nested):
    props = {}
    for i in range(rng.randint(0 if nested else 1, 4)):
        name = rng.choice(["city", "count", "opts", "items", "mode", "ratio", "flag", "note", "meta"]) + str(i)
        props[name] = random_top_schema(rng) if not nested else random_value_schema(rng, depth)
    required = [p for p in props if rng.random() < 0.6]
    schema = {"type": "object", "properties": props, "required": required}
    if nested:
        schema["additionalProperties"] = False
    return schema


def random_top_schema(rng):
    """A top-level parameter: raw strings (bounded, or enums) or JSON values."""
    k = rng.choice(["raw_str", "raw_enum", "json"])
    if k == "raw_str":
        s = {"type": "string", "maxLength": rng.randint(1, 10)}
        if rng.random() < 0.3:
            s["minLength"] = 1
        return s
    if k == "raw_enum":
        return {"type": "string", "enum": rng.sample(ENUM_STRINGS, rng.randint(1, 5))}
    return random_value_schema(rng, 1)


def random_tools(rng):
    tools = []
    for i in range(rng.randint(1, 4)):
        fn = {"name": f"tool_{i}_{rng.choice(['get', 'set', 'find', 'run'])}", "description": "a tool"}
        if rng.random() < 0.85:
            fn["parameters"] = random_object_schema(rng, 0, nested=False)
        tools.append({"type": "function", "function": fn})
    return tools


def check_calls(test, label, tools, calls, named=None, single=False):
    params = {t["function"]["name"]: t["function"].get("parameters", NO_PARAMETERS) for t in tools}
    test.assertTrue(calls, f"{label}: no tool calls")
    if named or single:
        test.assertEqual(len(calls), 1, f"{label}: {calls}")
    for name, arguments in calls:
        test.assertIn(name, params, label)
        if named:
            test.assertEqual(name, named, label)
        try:
            args = json.loads(arguments)
            jsonschema.validate(args, params[name])
        except Exception as e:  # noqa: BLE001  (the failure names the case)
            test.fail(f"{label}: {name}({arguments!r}) does not validate: {e}")


class ToolChoiceGlm(unittest.TestCase):
    FORMAT = "glm47"

    @classmethod
    def setUpClass(cls):
        cls.server = e2e.ServerProcess("--fake-uniform-logits", "--max-running-requests", "16",
                                       "--tool-call-parser", cls.FORMAT, "--served-model-name", "m")
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, seed, tools, choice, parallel=True):
        r = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0,
                                                seed=seed, tools=tools, tool_choice=choice,
                                                parallel_tool_calls=parallel)
        c = r.choices[0]
        calls = [(tc.function.name, tc.function.arguments) for tc in c.message.tool_calls or []]
        return c.finish_reason, c.message.content, calls, r.usage.completion_tokens

    def test_random_tool_sets_give_calls_that_validate(self):
        rng = random.Random(42 if self.FORMAT == "glm47" else 45)
        jobs = []
        for case in range(40 if self.FORMAT == "glm47" else 16):
            tools = random_tools(rng)
            named = rng.choice(tools)["function"]["name"]
            jobs.append((f"case {case} required", tools, "required", None, True))
            jobs.append((f"case {case} single", tools, "required", None, False))
            jobs.append((f"case {case} named {named}", tools,
                         {"type": "function", "function": {"name": named}}, named, True))
        finished = 0
        with cf.ThreadPoolExecutor(8) as pool:
            futures = [(job, pool.submit(self.chat, i, job[1], job[2], job[4])) for i, job in enumerate(jobs)]
            for (label, tools, _, named, parallel), fut in futures:
                finish, content, calls, tokens = fut.result()
                if finish == "length":
                    self.assertEqual(tokens, MAX_TOKENS, label)
                    continue
                finished += 1
                self.assertEqual(finish, "tool_calls", f"{label}: {content!r}")
                self.assertFalse(content, f"{label}: content {content!r}")
                check_calls(self, label, tools, calls, named, single=not parallel)
        # Uniform logits end most calls quickly (bounded strings, enums, bounded numbers).
        self.assertGreaterEqual(finished, len(jobs) * 3 // 4, f"{finished} of {len(jobs)} finished")

    def test_streamed_calls_validate(self):
        rng = random.Random(7)
        for seed in range(6):
            tools = random_tools(rng)
            named = tools[-1]["function"]["name"] if seed % 2 else None
            choice = {"type": "function", "function": {"name": named}} if named else "required"
            stream = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                         temperature=1.0, seed=seed, tools=tools, tool_choice=choice,
                                                         stream=True)
            _, content, calls, finish = assemble(stream)
            if finish == "length":
                continue
            self.assertEqual(finish, "tool_calls", content)
            self.assertEqual(content, "")
            for entry in calls.values():
                self.assertTrue(entry[0] and entry[0].startswith("call_"), entry)
            check_calls(self, f"stream {seed}", tools, [(e[1], e[2]) for e in calls.values()], named)

    def test_auto_and_none_are_unchanged(self):
        tools = [{"type": "function", "function": {"name": "f", "parameters": NO_PARAMETERS}}]
        for choice in ("auto", "none"):
            r = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=16, temperature=1.0,
                                                    seed=3, tools=tools, tool_choice=choice)
            self.assertIn(r.choices[0].finish_reason, ("stop", "length"), choice)  # unconstrained bytes

    def test_bad_cases_are_400_and_the_server_stays_healthy(self):
        def tool(params):
            return [{"type": "function", "function": {"name": "f", "parameters": params}}]

        named_f = {"type": "function", "function": {"name": "f"}}
        bad = [
            ({"tool_choice": "required"}, "tool_choice", "non-empty 'tools'"),
            ({"tools": tool(NO_PARAMETERS), "tool_choice": {"type": "function", "function": {"name": "g"}}},
             "tool_choice", "not in 'tools'"),
            ({"tools": tool(NO_PARAMETERS), "tool_choice": "required", "response_format": {"type": "json_object"}},
             "response_format", "both constrain"),
            ({"tools": tool({"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}),
              "tool_choice": "required"}, "tools[0].function.parameters.properties.x.pattern", "raw"),
            ({"tools": tool({"type": "object", "properties": {"x": {"type": ["string", "number"]}}}),
              "tool_choice": named_f}, "tools[0].function.parameters.properties.x", "may be a string"),
            ({"tools": tool({"type": "object", "properties": {"x": {"not": {}}}}), "tool_choice": "required"},
             "tools[0].function.parameters", "not"),
            ({"tools": tool({"type": "string"}), "tool_choice": "required"},
             "tools[0].function.parameters.type", "object"),
        ]
        for body, param, words in bad:
            with self.subTest(param=param, words=words):
                status, reply = self.server.json("POST", "/v1/chat/completions",
                                                 dict(body, messages=MESSAGES, max_tokens=8))
                self.assertEqual(status, 400, reply)
                self.assertEqual(reply["error"]["param"], param, reply)
                self.assertIn(words, reply["error"]["message"])
                self.assertNotIn("\n", reply["error"]["message"])
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        finish, _, calls, _ = self.chat(1, tool(NO_PARAMETERS), named_f)
        self.assertEqual((finish, calls), ("tool_calls", [("f", "{}")]))


class ToolChoiceGlm45(ToolChoiceGlm):
    FORMAT = "glm45"


class Refusals(unittest.TestCase):
    TOOLS = [{"type": "function", "function": {"name": "f", "parameters": NO_PARAMETERS}}]

    def refused(self, server, words):
        for choice in ("required", {"type": "function", "function": {"name": "f"}}):
            status, reply = server.json("POST", "/v1/chat/completions",
                                        {"messages": MESSAGES, "tools": self.TOOLS, "tool_choice": choice})
            self.assertEqual(status, 400, reply)
            self.assertEqual(reply["error"]["param"], "tool_choice")
            self.assertIn(words, reply["error"]["message"])
        self.assertEqual(server.request("GET", "/health")[0], 200)

    def test_without_a_tool_call_parser(self):
        server = e2e.ServerProcess("--fake-uniform-logits")
        try:
            self.refused(server, "--tool-call-parser")
        finally:
            server.stop()

    def test_with_a_deepseek_parser(self):
        server = e2e.ServerProcess("--fake-uniform-logits", "--tool-call-parser", "deepseekv31")
        try:
            self.refused(server, "special tokens")
        finally:
            server.stop()


class Reasoning(unittest.TestCase):
    def test_an_open_reasoning_block_is_free_text_before_the_calls(self):
        # deepseek-r1 starts inside the reasoning: the grammar lets any text through up to
        # </think> (which uniform logits practically never write), so the reply runs to length
        # with everything in reasoning_content; the grammar's acceptance of reasoning + calls is
        # checked in tool_choice_grammar_test.cpp.
        server = e2e.ServerProcess("--fake-uniform-logits", "--tool-call-parser", "glm45", "--reasoning-parser",
                                   "deepseek-r1")
        try:
            status, reply = server.json("POST", "/v1/chat/completions", {
                "messages": MESSAGES, "max_tokens": 24, "seed": 1, "tool_choice": "required",
                "tools": Refusals.TOOLS})
            self.assertEqual(status, 200, reply)
            c = reply["choices"][0]
            self.assertEqual(c["finish_reason"], "length")
            self.assertEqual(reply["usage"]["completion_tokens"], 24)
            self.assertTrue(c["message"]["reasoning_content"])
        finally:
            server.stop()


class TrainedModel(unittest.TestCase):
    """The shipped trained model on the CPU backend (its template renders `tools`; its BPE
    vocabulary has no tool-call special tokens, so the markers are ordinary tokens): greedy
    replies to "required" and a named choice are calls that validate."""
    TOOLS = [
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
            "module": {"type": "string", "enum": ["os", "sys", "re", "json"]},
            "depth": {"type": "integer", "minimum": 0, "maximum": 9},
            "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
            "alias": {"type": "string", "maxLength": 8}}, "required": ["module", "alias"]}}},
        {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
            "line": {"type": "integer", "minimum": 1, "maximum": 500}}, "required": ["line"]}}},
    ]

    def test_greedy_calls_validate(self):
        model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "glm5-mini-py")
        server = e2e.ServerProcess("--model", model, "--tool-call-parser", "glm47", "--served-model-name", "m",
                                   backend="cpu")
        try:
            client = server.client()
            for choice, named in (("required", None), ({"type": "function", "function": {"name": "run"}}, "run"),
                                  ({"type": "function", "function": {"name": "lookup"}}, "lookup")):
                # parallel_tool_calls false: greedy, this model goes on to a second call after the
                # first, which 200 tokens cut (a length reply, correct but not what is checked here).
                r = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "import os"}], max_tokens=200, temperature=0,
                    tools=self.TOOLS, tool_choice=choice, parallel_tool_calls=False)
                c = r.choices[0]
                self.assertEqual(c.finish_reason, "tool_calls", c.message)
                calls = [(tc.function.name, tc.function.arguments) for tc in c.message.tool_calls]
                check_calls(self, f"trained model, {choice}", self.TOOLS, calls, named)
        finally:
            server.stop()


if __name__ == "__main__":
    e2e.BINARY = sys.argv.pop(1) if len(sys.argv) > 1 else e2e.BINARY
    unittest.main(verbosity=2)
