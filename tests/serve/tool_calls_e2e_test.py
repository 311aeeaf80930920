#!/usr/bin/env python3
"""Reasoning and tool calls end to end with the real `openai` client (issue 41).

`fp4moe serve --backend fake --fake-script TEXT` answers every chat with TEXT (the byte-level
stand-in tokenizer: one token per byte), so the output parsers see exactly the text a GLM or
DeepSeek model would write. Checked: non-streamed `reasoning_content` / `tool_calls` /
`finish_reason: tool_calls`; streamed deltas that assemble to the same message; a `tool`
follow-up conversation; `tool_choice: "none"` and `separate_reasoning: false` turning the
parsers off; `parallel_tool_calls: false`; the helper endpoints; a bad parser flag at start-up.

    tool_calls_e2e_test.py PATH/TO/fp4moe
"""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openai_e2e_test as e2e  # noqa: E402  (ServerProcess, free_port)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"},
                                          "units": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
]

GLM_SCRIPT = ("<think>The user wants the weather in Zürich.</think>Let me check."
              "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
              "<arg_key>units</arg_key>\n<arg_value>{\"temp\": \"C\", \"wind\": [1, 2]}</arg_value>\n</tool_call>"
              "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>")
WEATHER_ARGS = {"city": "Zürich", "days": 3, "units": {"temp": "C", "wind": [1, 2]}}


def assemble(stream):
    """Streamed chat chunks -> (reasoning, content, {index: [id, name, arguments]}, finish_reason)."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        d = c.delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, [None, None, ""])
            if tc.id:
                assert entry[0] is None, "a call's id comes once, in its first delta"
                entry[0] = tc.id
                entry[1] = tc.function.name
            entry[2] += tc.function.arguments or ""
        if c.finish_reason:
            finish = c.finish_reason
    return reasoning, content, calls, finish


class GlmParsers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = e2e.ServerProcess("--reasoning-parser", "glm45", "--tool-call-parser", "glm45",
                                       "--fake-script", GLM_SCRIPT, "--served-model-name", "glm")
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, **kw):
        kw.setdefault("messages", [{"role": "user", "content": "Weather in Zürich, and the time?"}])
        kw.setdefault("max_tokens", 400)
        return self.client.chat.completions.create(model="glm", temperature=0, **kw)

    def test_non_streamed_message(self):
        r = self.chat(tools=TOOLS)
        m, c = r.choices[0].message, r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertEqual(m.reasoning_content, "The user wants the weather in Zürich.")
        self.assertEqual(m.content, "Let me check.")
        self.assertEqual([t.function.name for t in m.tool_calls], ["get_weather", "get_time"])
        self.assertEqual(json.loads(m.tool_calls[0].function.arguments), WEATHER_ARGS)
        self.assertEqual(json.loads(m.tool_calls[1].function.arguments), {"zone": "CET"})
        self.assertTrue(all(t.type == "function" and t.id for t in m.tool_calls))
        self.assertNotEqual(m.tool_calls[0].id, m.tool_calls[1].id)

    def test_streamed_deltas_assemble_to_the_same_message(self):
        reasoning, content, calls, finish = assemble(self.chat(tools=TOOLS, stream=True))
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(reasoning, "The user wants the weather in Zürich.")
        self.assertEqual(content, "Let me check.")
        self.assertEqual(sorted(calls), [0, 1])
        self.assertEqual(calls[0][1], "get_weather")
        self.assertEqual(json.loads(calls[0][2]), WEATHER_ARGS)
        self.assertEqual((calls[1][1], json.loads(calls[1][2])), ("get_time", {"zone": "CET"}))

    def test_tool_follow_up(self):
        first = self.chat(tools=TOOLS).choices[0].message
        msgs = [{"role": "user", "content": "Weather in Zürich, and the time?"},
                {"role": "assistant", "content": first.content,
                 "tool_calls": [t.model_dump() for t in first.tool_calls]}]
        for t in first.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": t.id, "content": json.dumps({"ok": True})})
        r = self.chat(tools=TOOLS, messages=msgs)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")  # the script answers again
        self.assertGreater(r.usage.prompt_tokens, len("Weather in Zürich"))

    def test_tool_choice_none_and_no_tools_leave_the_calls_as_text(self):
        for kw in ({"tools": TOOLS, "tool_choice": "none"}, {}):
            r = self.chat(**kw)
            m = r.choices[0].message
            self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertFalse(m.tool_calls)
            self.assertIn("<tool_call>get_weather", m.content)
            self.assertEqual(m.reasoning_content, "The user wants the weather in Zürich.")

    def test_separate_reasoning_false(self):
        r = self.chat(tools=TOOLS, extra_body={"separate_reasoning": False})
        m = r.choices[0].message
        self.assertIsNone(getattr(m, "reasoning_content", None))
        self.assertTrue(m.content.startswith("<think>The user wants"))

    def test_parallel_tool_calls_false_keeps_the_first_call(self):
        r = self.chat(tools=TOOLS, parallel_tool_calls=False)
        self.assertEqual([t.function.name for t in r.choices[0].message.tool_calls], ["get_weather"])
        _, _, calls, finish = assemble(self.chat(tools=TOOLS, parallel_tool_calls=False, stream=True))
        self.assertEqual((sorted(calls), finish), ([0], "tool_calls"))

    def test_truncated_call_is_content(self):
        # max_tokens ends the script inside the second call: it comes back as text, never a 500.
        cut = GLM_SCRIPT.encode().index(b"<tool_call>get_time") + 12
        r = self.chat(tools=TOOLS, max_tokens=cut)
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "length")
        self.assertEqual([t.function.name for t in c.message.tool_calls], ["get_weather"])
        self.assertIn("<tool_call>g", c.message.content)

    def test_helper_endpoints(self):
        status, body = self.server.json("POST", "/parse_function_call",
                                        {"text": GLM_SCRIPT.split("</think>")[1], "tool_call_parser": "glm45",
                                         "tools": TOOLS})
        self.assertEqual(status, 200)
        self.assertEqual(body["normal_text"], "Let me check.")
        self.assertEqual([c["name"] for c in body["calls"]], ["get_weather", "get_time"])
        self.assertEqual(json.loads(body["calls"][0]["parameters"]), WEATHER_ARGS)
        status, body = self.server.json("POST", "/separate_reasoning",
                                        {"text": "<think>a</think>b", "reasoning_parser": "glm45"})
        self.assertEqual((status, body), (200, {"text": "b", "reasoning_text": "a"}))
        status, body = self.server.json("POST", "/separate_reasoning", {"text": "x", "reasoning_parser": "qwen"})
        self.assertEqual((status, body["error"]["param"]), (400, "reasoning_parser"))

    def test_bad_tools_are_400(self):
        for tools, param in (({"not": "a list"}, "tools"), ([{"type": "function", "function": {}}], "tools")):
            status, body = self.server.json("POST", "/v1/chat/completions",
                                            {"messages": [{"role": "user", "content": "x"}], "tools": tools})
            self.assertEqual(status, 400, body)
            self.assertTrue(body["error"]["param"].startswith(param), body)
        status, body = self.server.json("POST", "/v1/chat/completions",
                                        {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                                         "tool_choice": {"type": "function", "function": {"name": "nope"}}})
        self.assertEqual(status, 400, body)
        status, body = self.server.json("POST", "/v1/chat/completions",
                                        {"messages": [{"role": "tool", "content": "x"}], "tools": TOOLS})
        self.assertEqual(status, 400, body)
        self.assertEqual(self.server.request("GET", "/health")[0], 200)


class DeepSeekParsers(unittest.TestCase):
    SCRIPT = ("thinking first</think>Calling."
              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"UTC\"}"
              "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")

    def test_deepseek_r1_and_v31(self):
        server = e2e.ServerProcess("--reasoning-parser", "deepseek-r1", "--tool-call-parser", "deepseekv31",
                                   "--fake-script", self.SCRIPT)
        try:
            client = server.client()
            r = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "t?"}], tools=TOOLS,
                                               temperature=0, max_tokens=400)
            m = r.choices[0].message
            self.assertEqual(m.reasoning_content, "thinking first")
            self.assertEqual(m.content, "Calling.")
            self.assertEqual([(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls],
                             [("get_time", {"zone": "UTC"})])
            reasoning, content, calls, finish = assemble(client.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "t?"}], tools=TOOLS, temperature=0,
                max_tokens=400, stream=True))
            self.assertEqual((reasoning, content, finish), ("thinking first", "Calling.", "tool_calls"))
            self.assertEqual(json.loads(calls[0][2]), {"zone": "UTC"})
        finally:
            server.stop()


class Flags(unittest.TestCase):
    def test_unknown_parser_names_are_one_line_and_exit_non_zero(self):
        for flag in ("--reasoning-parser", "--tool-call-parser"):
            p = subprocess.run([e2e.BINARY, "serve", "--backend", "fake", "--port", str(e2e.free_port()), flag, "qwen9"],
                               capture_output=True, text=True, timeout=20)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("unknown parser 'qwen9'", p.stderr + p.stdout)

    def test_fake_options_are_refused_on_a_real_backend(self):
        for flag, value in (("--fake-script", "hi"), ("--fake-eos-period", "0")):
            p = subprocess.run([e2e.BINARY, "serve", "--backend", "cpu", "--model", "/nonexistent", flag, value],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"{flag}: only with --backend fake (got --backend cpu)", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        print("usage: tool_calls_e2e_test.py PATH/TO/fp4moe [unittest args]")
        sys.exit(2)
    e2e.BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
