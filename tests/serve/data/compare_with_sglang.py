#!/usr/bin/env python3
"""Runs SGLang's own detectors over parser_goldens.json and prints where they differ from
our expected outputs (a check of the goldens against SGLang, not a test: the differences
listed in src/serve/README.md are deliberate). SGLang is not a dependency; fetch its wheel
without dependencies and the two small packages its detectors import:

  pip download sglang==0.5.23 --no-deps -d /tmp/sgl && unzip -q /tmp/sgl/*.whl 'sglang/*' -d /tmp/sgl/x
  pip install --target /tmp/sgl/lib partial-json-parser msgspec
  python3 tests/serve/data/compare_with_sglang.py /tmp/sgl/x /tmp/sgl/lib

Modules the detectors import but do not use here (torch, transformers, the OpenAI protocol
models, ...) are replaced by empty stand-ins written below."""
import enum
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import types

STUBBED = ("xgrammar", "torch", "transformers", "openai_harmony", "tiktoken", "zmq", "numpy", "jsonschema",
           "outlines", "llguidance", "sentencepiece", "huggingface_hub", "safetensors", "triton", "psutil",
           "requests", "aiohttp", "fastapi", "uvicorn", "PIL", "uvloop", "sglang.")


class _Empty(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A module under STUBBED that cannot be found is an empty stand-in."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(STUBBED):
            return None
        for finder in sys.meta_path:
            if finder is not self and finder.find_spec(fullname, path, target) is not None:
                return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _Empty(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def install_stand_ins():
    from pydantic import BaseModel
    from typing import Any, Optional

    class Function(BaseModel):
        name: Optional[str] = None
        description: Optional[str] = None
        parameters: Optional[Any] = None
        strict: bool = False

    class Tool(BaseModel):
        type: str = "function"
        function: Function

    protocol = _Empty("sglang.srt.entrypoints.openai.protocol")
    protocol.Tool, protocol.Function = Tool, Function
    sys.modules["sglang.srt.entrypoints.openai.protocol"] = protocol

    class _Env:
        def get(self):
            return False

    class ToolStrictLevel(enum.IntEnum):
        OFF = 0
        FUNCTION = 1
        PARAMETER = 2

    environ = _Empty("sglang.srt.environ")
    environ.envs = type("Envs", (), {"__getattr__": lambda self, name: _Env()})()
    environ.ToolStrictLevel = ToolStrictLevel
    sys.modules["sglang.srt.environ"] = environ
    # The packages on the way, without their __init__ imports (which load the whole server).
    for pkg in ("sglang", "sglang.srt", "sglang.srt.entrypoints", "sglang.srt.entrypoints.openai",
                "sglang.srt.function_call", "sglang.srt.parser"):
        m = types.ModuleType(pkg)
        m.__path__ = [os.path.join(SGLANG_ROOT, *pkg.split(".")[1:])]
        sys.modules[pkg] = m
    utils = _Empty("sglang.srt.utils")  # server utilities: not used by the parsers
    utils.__path__ = []
    sys.modules["sglang.srt.utils"] = utils
    return Tool


def main():
    global SGLANG_ROOT
    SGLANG_ROOT = os.path.join(sys.argv[1], "sglang")
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    sys.meta_path.append(_StubFinder())
    logging.disable(logging.CRITICAL)
    Tool = install_stand_ins()
    from sglang.srt.function_call.deepseekv3_detector import DeepSeekV3Detector
    from sglang.srt.function_call.deepseekv31_detector import DeepSeekV31Detector
    from sglang.srt.function_call.glm47_moe_detector import Glm47MoeDetector
    from sglang.srt.function_call.glm4_moe_detector import Glm4MoeDetector
    from sglang.srt.parser.reasoning_parser import ReasoningParser
    detectors = {"glm47": Glm47MoeDetector, "glm45": Glm4MoeDetector, "deepseekv3": DeepSeekV3Detector,
                 "deepseekv31": DeepSeekV31Detector}

    def parse_non_stream(parser, tools, text):  # FunctionCallParser.parse_non_stream
        d = detectors[parser]()
        has = d.has_tool_call(text)
        r = d.detect_and_parse(text, tools)
        return (r.normal_text, r.calls) if (r.calls or has) else (text, [])

    here = os.path.dirname(os.path.abspath(__file__))
    g = json.load(open(os.path.join(here, "parser_goldens.json"), encoding="utf-8"))
    same_calls = same_all = 0
    for i, c in enumerate(g["tool_calls"]):
        tools = list(g["tools"])
        if "extra_tool" in c:
            tools.append({"type": "function", "function": {"name": c["extra_tool"]}})
        try:
            normal, calls = parse_non_stream(c["parser"], [Tool(**t) for t in tools], c["text"])
        except Exception as e:  # noqa: BLE001 - reported, not raised
            normal, calls = f"<exception {e}>", []
        got = [{"name": x.name, "tool_index": x.tool_index, "arguments": x.parameters} for x in calls]
        same_calls += got == c["calls"]
        same_all += got == c["calls"] and normal == c["content"]
        if got != c["calls"] or normal != c["content"]:
            print(f"--- tool_calls[{i}] {c['parser']}: {c['text']!r}")
            if normal != c["content"]:
                print(f"    content: ours {c['content']!r}, SGLang {normal!r}")
            if got != c["calls"]:
                print(f"    calls:   ours {c['calls']}\n             SGLang {got}")
    same_split = 0
    for i, c in enumerate(g["reasoning"]):
        r, n = ReasoningParser(c["parser"], stream_reasoning=True, force_reasoning=c["starts_open"]).parse_non_stream(c["text"])
        if (r or "", n or "") == (c["reasoning"], c["content"]):
            same_split += 1
        else:
            print(f"--- reasoning[{i}] {c['parser']} open={c['starts_open']}: {c['text']!r}\n"
                  f"    ours ({c['reasoning']!r}, {c['content']!r}), SGLang ({r!r}, {n!r})")
    print(f"tool calls: {len(g['tool_calls'])} texts, SGLang gives the same calls for {same_calls}, "
          f"the same calls and content for {same_all}")
    print(f"reasoning: {len(g['reasoning'])} texts, SGLang gives the same split for {same_split}")


if __name__ == "__main__":
    main()
